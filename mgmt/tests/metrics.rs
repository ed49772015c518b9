//! The Prometheus endpoint of the real `blockwire-target` binary:
//!
//! - after known READ/WRITE traffic, a refused login and a LUN reset, the
//!   scraped exposition counts exactly that traffic per LUN (a RAM LUN the
//!   SCSI core serves, a cached file LUN whose READs go by sendfile), the
//!   refusal by reason, the reset by function and response and the target's
//!   session while it is logged in, and Debian's
//!   `promtool check metrics` accepts it;
//! - each initiator's READ/WRITE counters on the target add up its traffic
//!   over its sessions and LUNs while it is logged in, and go with its last
//!   session;
//! - a real Prometheus server scraping the endpoint sees the LUN's READ and
//!   WRITE counters and latency histogram grow with the traffic.
//!
//! Both need Debian's `prometheus` package (promtool, prometheus) and fail,
//! naming it, when it is missing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_initiator::{DataDir, InitiatorConfig, Session};

mod daemon;
use daemon::DaemonProcess as Daemon;

const IQN: &str = "iqn.2026-11.io.blockwire:metrics";
const BLOCK: u32 = 512;
/// Blocks per command: 64 KiB.
const BLOCKS: u32 = 128;

/// Starts the daemon with a RAM LUN 0 and a cached file LUN 1 and the
/// metrics endpoint on a free port; returns it, its portal and endpoint.
fn start() -> (Daemon, SocketAddr, SocketAddr) {
    start_with("", "")
}

/// [`start`], with `group` added to the portal group's settings and
/// `lun1` to LUN 1's.
fn start_with(group: &str, lun1: &str) -> (Daemon, SocketAddr, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("metrics.toml");
    let file = dir.path().join("lun1.img");
    std::fs::write(
        &config,
        format!(
            "[metrics]\nlisten = \"127.0.0.1:0\"\n\n\
             [fabric]\nnop_interval_secs = 0\n\n\
             [[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n{group}\n\
             [[target]]\nname = \"{IQN}\"\n\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\nlow_space_threshold = \"1M\"\n\n\
             [[target.lun]]\nid = 1\nbackstore = \"file\"\npath = \"{}\"\nsize = \"8M\"\n\
             iops_limit = 1000\n{lun1}\n",
            file.display()
        ),
    )
    .unwrap();
    let mut d = Daemon::spawn(dir, &config, ["--log", "info"]);
    let portal = logged_portal(&mut d, "the listening portal", |l| {
        l.contains("listening") && !l.contains("iSER")
    });
    let metrics = d.wait_log("the metrics endpoint", |log| {
        log.lines().find_map(|l| {
            l.split_once("Prometheus metrics at http://")?
                .1
                .split('/')
                .next()?
                .parse()
                .ok()
        })
    });
    (d, portal, metrics)
}

/// The `portal=` address of the first line of the daemon's log that `line` picks.
fn logged_portal(d: &mut Daemon, what: &str, line: impl Fn(&str) -> bool) -> SocketAddr {
    d.wait_log(what, |log| {
        log.lines().filter(|l| line(l)).find_map(|l| {
            l.split_once("portal=")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
    })
}

/// GET `path` from `addr` over plain HTTP/1.1; the status code and body.
fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

/// The body of a chunked response.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("chunk size line");
        let n = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
}

/// The value of the sample `series` (name and labels exactly as exposed).
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| {
        let (s, v) = l.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok())?
    })
}

fn series(name: &str, lun: u16, op: &str) -> String {
    format!("{name}{{target=\"{IQN}\",lun=\"{lun}\",op=\"{op}\"}}")
}

/// Writes `writes` and reads `reads` 64 KiB commands on `lun`, then logs out.
async fn traffic(portal: SocketAddr, lun: u16, writes: u32, reads: u32) {
    let s = logged_in(portal, "iqn.2026-11.io.blockwire.test:metrics", 0).await;
    io(&s, lun, writes, reads).await;
    s.logout().await.expect("logout");
}

/// `name` on PATH, or a failure that says which package provides it.
fn tool(name: &str) -> String {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{name} is not installed: this test needs Debian's prometheus package \
         (apt-get install -y prometheus; .ci/run installs it)"
    );
    name.to_owned()
}

fn promtool_check(exposition: &str) {
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused the exposition ({}):\n{}{}\n--- exposition ---\n{exposition}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_exposition_counts_the_traffic_and_passes_promtool() {
    tool("promtool");
    let (d, portal, metrics) = start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        traffic(portal, 0, 3, 5).await;
        traffic(portal, 1, 2, 4).await;
        // A login to a target the daemon does not serve is refused.
        let refused = Session::connect(
            InitiatorConfig::new("iqn.2026-11.io.blockwire.test:metrics"),
            &portal.to_string(),
            "iqn.2026-11.io.blockwire:no-such-target",
        )
        .await;
        assert!(refused.is_err(), "login to an unknown target succeeded");
        let s = Arc::new(
            Session::connect(
                InitiatorConfig::new("iqn.2026-11.io.blockwire.test:metrics-tmf"),
                &portal.to_string(),
                IQN,
            )
            .await
            .expect("login"),
        );
        s.lun_reset(0).await.expect("LUN RESET");
        // While it is logged in, the target has one session.
        let (_, text) = http_get(metrics, "/metrics");
        let sessions = format!("blockwire_target_sessions{{target=\"{IQN}\"}}");
        assert_eq!(sample(&text, &sessions), Some(1.0), "{text}");
        // Its one connection runs on one of the daemon's connection threads
        // (one per CPU by default).
        let on_threads: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with("blockwire_connection_thread_connections{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
            .collect();
        assert_eq!(
            on_threads.len(),
            std::thread::available_parallelism().unwrap().get(),
            "{text}"
        );
        assert_eq!(on_threads.iter().sum::<f64>(), 1.0, "{text}");
        Arc::try_unwrap(s).unwrap().logout().await.expect("logout");
    });
    // A planned command is counted when the fabric drops its plan or hold,
    // which need not happen before the initiator sees the status: poll
    // briefly.
    let want = [
        (series("blockwire_lun_commands_total", 0, "write"), 3.0),
        (series("blockwire_lun_commands_total", 0, "read"), 5.0),
        (series("blockwire_lun_commands_total", 1, "write"), 2.0),
        (series("blockwire_lun_commands_total", 1, "read"), 4.0),
        (series("blockwire_lun_bytes_total", 0, "write"), 3.0 * 65536.0),
        (series("blockwire_lun_bytes_total", 0, "read"), 5.0 * 65536.0),
        (series("blockwire_lun_bytes_total", 1, "read"), 4.0 * 65536.0),
        (series("blockwire_lun_command_errors_total", 0, "read"), 0.0),
        // LUN 1's ceiling; its few commands fit in the burst.
        (
            format!("blockwire_lun_qos_iops_limit{{target=\"{IQN}\",lun=\"1\"}}"),
            1000.0,
        ),
        (
            format!("blockwire_lun_qos_delayed_commands_total{{target=\"{IQN}\",lun=\"1\"}}"),
            0.0,
        ),
        (
            series("blockwire_lun_command_duration_seconds_count", 1, "read"),
            4.0,
        ),
        (
            "blockwire_login_failures_total{reason=\"target_not_found\"}".to_owned(),
            1.0,
        ),
        // Every session logged out.
        (format!("blockwire_target_sessions{{target=\"{IQN}\"}}"), 0.0),
        // LUN 0's three 64 KiB WRITEs fell in its first 1 MiB chunk.
        ("blockwire_ram_bytes".to_owned(), 1048576.0),
        (
            format!("blockwire_lun_space_used_bytes{{target=\"{IQN}\",lun=\"0\"}}"),
            1048576.0,
        ),
        (
            format!("blockwire_lun_low_space_threshold_bytes{{target=\"{IQN}\",lun=\"0\"}}"),
            1048576.0,
        ),
        (
            "blockwire_task_management_total{function=\"logical_unit_reset\",response=\"function_complete\"}"
                .to_owned(),
            1.0,
        ),
    ];
    let want: Vec<_> = want.into_iter().map(|(s, v)| (s, Some(v))).collect();
    let text = scrape_until(metrics, &want);
    // Every READ of LUN 0 took some time: the +Inf bucket holds them all
    // and the sum is positive.
    let inf = format!(
        "blockwire_lun_command_duration_seconds_bucket{{target=\"{IQN}\",lun=\"0\",op=\"read\",le=\"+Inf\"}}"
    );
    assert_eq!(sample(&text, &inf), Some(5.0), "{text}");
    let sum = sample(
        &text,
        &series("blockwire_lun_command_duration_seconds_sum", 0, "read"),
    );
    assert!(sum.is_some_and(|s| s > 0.0), "{text}");
    // The file LUN's space: its blocks of the two WRITEs, and what its file
    // system has left; no threshold, no threshold series.
    let on_lun1 = |name: &str| sample(&text, &format!("{name}{{target=\"{IQN}\",lun=\"1\"}}"));
    assert!(
        on_lun1("blockwire_lun_space_used_bytes").is_some_and(|b| b >= 131072.0),
        "{text}"
    );
    assert!(
        on_lun1("blockwire_lun_space_available_bytes").is_some_and(|b| b > 0.0),
        "{text}"
    );
    assert_eq!(
        on_lun1("blockwire_lun_low_space_threshold_bytes"),
        None,
        "{text}"
    );
    // LUN 0 has no ceiling: no limit series.
    let no_limit = format!("blockwire_lun_qos_iops_limit{{target=\"{IQN}\",lun=\"0\"}}");
    assert_eq!(sample(&text, &no_limit), None, "{text}");
    promtool_check(&text);
    // Anything but /metrics is a clear 404.
    let (status, body) = http_get(metrics, "/nope");
    assert_eq!(status, 404);
    assert!(body.contains("/metrics"), "{body}");
    drop(d);
}

/// A logged-in session of `initiator` with ISID qualifier `qualifier`. The
/// first command of a new I_T nexus on a LUN is answered UNIT ATTENTION
/// (power on): a TEST UNIT READY on LUNs 0 and 1 takes it (not a READ or
/// WRITE, so not counted), so that the READs and WRITEs after all end GOOD
/// and count exactly.
async fn logged_in(portal: SocketAddr, initiator: &str, qualifier: u16) -> Session {
    let mut config = InitiatorConfig::new(initiator);
    config.isid_qualifier = qualifier;
    let s = Session::connect(config, &portal.to_string(), IQN)
        .await
        .expect("login");
    for lun in [0, 1] {
        let _ = s.execute(lun, &[0u8; 6], DataDir::None).await;
    }
    s
}

/// `writes` 64 KiB WRITEs then `reads` 64 KiB READs on `lun` from `s`.
async fn io(s: &Session, lun: u16, writes: u32, reads: u32) {
    let data = vec![0x5au8; (BLOCK * BLOCKS) as usize];
    for i in 0..writes {
        s.write(lun, u64::from(i * BLOCKS), BLOCKS, &data)
            .await
            .expect("WRITE");
    }
    for i in 0..reads {
        let mut buf = vec![0u8; data.len()];
        let lba = u64::from((i % writes.max(1)) * BLOCKS);
        let c = s.read(lun, lba, BLOCKS, &mut buf).await.expect("READ");
        assert_eq!(c.transferred, data.len());
    }
}

/// Polls the exposition until every series of `want` has its value (None:
/// absent), or fails naming those that do not; returns the last exposition.
fn scrape_until(metrics: SocketAddr, want: &[(String, Option<f64>)]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, text) = http_get(metrics, "/metrics");
        assert_eq!(status, 200, "{text}");
        let wrong: Vec<_> = want
            .iter()
            .filter(|(s, v)| sample(&text, s) != *v)
            .map(|(s, v)| format!("{s}: want {v:?}, got {:?}", sample(&text, s)))
            .collect();
        if wrong.is_empty() {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "the exposition does not show the traffic:\n{}\n--- exposition ---\n{text}",
            wrong.join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn each_initiators_traffic_is_counted_over_its_sessions_while_it_is_logged_in() {
    tool("promtool");
    const HOST_A: &str = "iqn.2026-11.io.blockwire.test:host-a";
    const HOST_B: &str = "iqn.2026-11.io.blockwire.test:host-b";
    let per_host = |name: &str, host: &str, op: &str| {
        format!("{name}{{target=\"{IQN}\",initiator=\"{host}\",op=\"{op}\"}}")
    };
    let paths = |host: &str| {
        format!("blockwire_initiator_sessions{{target=\"{IQN}\",initiator=\"{host}\"}}")
    };
    let (d, portal, metrics) = start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Host A over two sessions (two paths: ISIDs differ) and both LUNs: the RAM
        // LUN the core serves, the file LUN whose READs go by sendfile and whose
        // WRITEs by the double-buffered path.
        let a1 = logged_in(portal, HOST_A, 1).await;
        let a2 = logged_in(portal, HOST_A, 2).await;
        let b = logged_in(portal, HOST_B, 1).await;
        io(&a1, 0, 2, 0).await;
        io(&a1, 1, 1, 0).await;
        io(&a2, 1, 0, 3).await;
        io(&a2, 0, 0, 1).await;
        io(&b, 0, 1, 2).await;
        let bytes = |n: f64| Some(n * 65536.0);
        let text = scrape_until(
            metrics,
            &[
                (per_host("blockwire_initiator_commands_total", HOST_A, "write"), Some(3.0)),
                (per_host("blockwire_initiator_commands_total", HOST_A, "read"), Some(4.0)),
                (per_host("blockwire_initiator_bytes_total", HOST_A, "write"), bytes(3.0)),
                (per_host("blockwire_initiator_bytes_total", HOST_A, "read"), bytes(4.0)),
                (per_host("blockwire_initiator_command_errors_total", HOST_A, "read"), Some(0.0)),
                (per_host("blockwire_initiator_command_duration_seconds_count", HOST_A, "read"), Some(4.0)),
                (per_host("blockwire_initiator_commands_total", HOST_B, "write"), Some(1.0)),
                (per_host("blockwire_initiator_commands_total", HOST_B, "read"), Some(2.0)),
                (per_host("blockwire_initiator_bytes_total", HOST_B, "read"), bytes(2.0)),
                (paths(HOST_A), Some(2.0)),
                (paths(HOST_B), Some(1.0)),
            ],
        );
        let inf = format!(
            "blockwire_initiator_command_duration_seconds_bucket{{target=\"{IQN}\",initiator=\"{HOST_A}\",op=\"write\",le=\"+Inf\"}}"
        );
        assert_eq!(sample(&text, &inf), Some(3.0), "{text}");
        promtool_check(&text);
        // One of A's two sessions goes: A is still there, its counts kept.
        a1.logout().await.expect("logout");
        io(&a2, 0, 1, 0).await;
        scrape_until(
            metrics,
            &[
                (per_host("blockwire_initiator_commands_total", HOST_A, "write"), Some(4.0)),
                (paths(HOST_A), Some(1.0)),
            ],
        );
        // Its last session goes, and its series with it; B's stay.
        a2.logout().await.expect("logout");
        scrape_until(
            metrics,
            &[
                (per_host("blockwire_initiator_commands_total", HOST_A, "write"), None),
                (paths(HOST_A), None),
                (per_host("blockwire_initiator_commands_total", HOST_B, "write"), Some(1.0)),
            ],
        );
        b.logout().await.expect("logout");
    });
    drop(d);
}

#[test]
fn each_initiators_qos_waits_are_counted_on_its_own_series() {
    tool("promtool");
    const HOST_A: &str = "iqn.2026-11.io.blockwire.test:busy-host";
    const HOST_B: &str = "iqn.2026-11.io.blockwire.test:quiet-host";
    /// READs host A sends at once, held to 10 IOPS: one per 100 ms, less
    /// a burst of 50 ms (the first starts at once, the second after 50 ms).
    const BUSY_READS: u64 = 8;
    let per_host =
        |name: &str, host: &str| format!("{name}{{target=\"{IQN}\",initiator=\"{host}\"}}");
    let per_lun = |name: &str| format!("{name}{{target=\"{IQN}\",lun=\"1\"}}");
    let (d, portal, metrics) = start_with("", "initiator_iops_limit = 10");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let a = Arc::new(logged_in(portal, HOST_A, 1).await);
        let b = logged_in(portal, HOST_B, 1).await;
        let reads: Vec<_> = (0..BUSY_READS)
            .map(|i| {
                let a = a.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; (BLOCK * BLOCKS) as usize];
                    a.read(1, i * u64::from(BLOCKS), BLOCKS, &mut buf)
                        .await
                        .expect("READ")
                })
            })
            .collect();
        for r in reads {
            r.await.unwrap();
        }
        // Host B's READ, after A's: A's ceiling is A's alone.
        io(&b, 1, 0, 1).await;
        let text = scrape_until(
            metrics,
            &[
                (
                    per_host("blockwire_initiator_commands_total", HOST_A)
                        .replace("\"}", "\",op=\"read\"}"),
                    Some(BUSY_READS as f64),
                ),
                (
                    per_host("blockwire_initiator_qos_delayed_commands_total", HOST_B),
                    Some(0.0),
                ),
                (
                    per_host("blockwire_initiator_qos_delay_seconds_total", HOST_B),
                    Some(0.0),
                ),
            ],
        );
        let value =
            |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series}:\n{text}"));
        let delayed = value(&per_host(
            "blockwire_initiator_qos_delayed_commands_total",
            HOST_A,
        ));
        let delay = value(&per_host(
            "blockwire_initiator_qos_delay_seconds_total",
            HOST_A,
        ));
        // Sent at once, all but the first wait (fewer only if they
        // arrived spread over hundreds of milliseconds).
        assert!(
            delayed >= 3.0 && delayed <= (BUSY_READS - 1) as f64,
            "{delayed}\n{text}"
        );
        assert!(delay >= 0.3, "{delay} s\n{text}");
        // Only host A was held back, so its series are the LUN's.
        assert_eq!(
            Some(delayed),
            sample(&text, &per_lun("blockwire_lun_qos_delayed_commands_total")),
            "{text}"
        );
        assert_eq!(
            Some(delay),
            sample(&text, &per_lun("blockwire_lun_qos_delay_seconds_total")),
            "{text}"
        );
        promtool_check(&text);
        Arc::try_unwrap(a).unwrap().logout().await.expect("logout");
        b.logout().await.expect("logout");
    });
    drop(d);
}

/// A Prometheus server, killed (by its PID) when dropped, even when the
/// test failed.
struct Prometheus {
    child: Child,
    api: SocketAddr,
    log: std::path::PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, scrape: SocketAddr) -> Prometheus {
        let bin = tool("prometheus");
        let api = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: blockwire\n    static_configs:\n      - targets: ['{scrape}']\n"
            ),
        )
        .unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={api}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start prometheus");
        Prometheus { child, api, log }
    }

    /// The value of the instant query `q` (summed over its series), once
    /// Prometheus answers.
    fn query(&mut self, q: &str) -> Option<f64> {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "prometheus exited ({status}):\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        TcpStream::connect(self.api).ok()?;
        let (status, body) = http_get(self.api, &format!("/api/v1/query?query={}", encode(q)));
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON from prometheus");
        let result = v["data"]["result"].as_array()?;
        if result.is_empty() {
            return None;
        }
        Some(
            result
                .iter()
                .filter_map(|r| r["value"][1].as_str()?.parse::<f64>().ok())
                .sum(),
        )
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- prometheus log ---\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// Percent-encodes a query string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_prometheus_server_scrapes_the_lun_traffic() {
    let (d, portal, metrics) = start();
    let scratch = tempfile::tempdir().unwrap();
    let mut prom = Prometheus::start(scratch.path(), metrics);
    // Prometheus is up and scraping before the traffic: the counters are
    // seen at zero first, then grow.
    let writes =
        format!("sum(blockwire_lun_commands_total{{target=\"{IQN}\",lun=\"0\",op=\"write\"}})");
    let deadline = Instant::now() + Duration::from_secs(60);
    while prom.query(&writes) != Some(0.0) {
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped the daemon at {metrics}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(traffic(portal, 0, 6, 9));
    let want = [
        (writes.clone(), 6.0),
        (
            format!("sum(blockwire_lun_commands_total{{target=\"{IQN}\",lun=\"0\",op=\"read\"}})"),
            9.0,
        ),
        (
            format!("sum(blockwire_lun_bytes_total{{target=\"{IQN}\",lun=\"0\",op=\"read\"}})"),
            9.0 * 65536.0,
        ),
        (
            format!(
                "sum(blockwire_lun_command_duration_seconds_bucket{{target=\"{IQN}\",lun=\"0\",op=\"write\",le=\"+Inf\"}})"
            ),
            6.0,
        ),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: Vec<_> = want.iter().map(|(q, _)| prom.query(q)).collect();
        if want.iter().zip(&got).all(|((_, v), g)| *g == Some(*v)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus does not show the traffic: {:?}",
            want.iter()
                .map(|(q, v)| (q, v))
                .zip(got)
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // The histogram holds the WRITEs' latencies: a quantile over it is a
    // positive, finite number of seconds.
    let p99 = prom
        .query(&format!(
            "histogram_quantile(0.99, sum by (le) (blockwire_lun_command_duration_seconds_bucket{{target=\"{IQN}\",lun=\"0\",op=\"write\"}}))"
        ))
        .expect("a quantile");
    assert!(p99 > 0.0 && p99.is_finite(), "p99 {p99}");
    // docs/metrics.md's per-host latency query, as the page writes it,
    // answers for a host that writes while logged in (a host's series go
    // with its last session).
    let host = rt.block_on(logged_in(portal, "iqn.2026-11.test:host-p", 7));
    // rate() needs the host's series scraped before its WRITEs too.
    let seen = "sum(blockwire_initiator_sessions{initiator=\"iqn.2026-11.test:host-p\"})";
    let deadline = Instant::now() + Duration::from_secs(60);
    while prom.query(seen) != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "prometheus never saw host-p's session"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    rt.block_on(io(&host, 0, 4, 0));
    let per_host = documented_per_host_query();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match prom.query(&per_host) {
            Some(v) if v > 0.0 && v.is_finite() => break,
            got => assert!(
                Instant::now() < deadline,
                "docs/metrics.md's query `{per_host}` answers {got:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    rt.block_on(host.logout()).expect("logout");
    drop(prom);
    drop(d);
}

/// The per-host latency query docs/metrics.md gives, joined from its
/// indented lines.
fn documented_per_host_query() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .expect("docs/metrics.md");
    let lines: Vec<&str> = doc.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("    histogram_quantile(0.99, sum by (initiator, le)"))
        .expect("docs/metrics.md gives the per-host latency query");
    lines[at..]
        .iter()
        .take_while(|l| l.starts_with("    "))
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join(" ")
}

/// An iSER portal on the soft RDMA provider (`iser_listen`, on another
/// loopback address than the TCP portal's): after blockwire's iSER initiator
/// writes and reads through it, the exposition counts the connection, the
/// RDMA Reads that took the WRITE data, the RDMA Writes that placed the READ
/// data and their bytes, and promtool accepts it.
#[test]
fn the_exposition_counts_iser_traffic() {
    use blockwire_initiator::iser::IserSession;
    use blockwire_initiator::rdma::RdmaConfig;

    tool("promtool");
    let (mut d, _, metrics) = start_with("iser_listen = [\"127.0.0.2:0\"]\n", "");
    let iser = logged_portal(&mut d, "the iSER portal", |l| l.contains("iSER portal"));
    let (_, before) = http_get(metrics, "/metrics");
    assert_eq!(
        sample(&before, "blockwire_iser_connections_total"),
        Some(0.0),
        "{before}"
    );
    let (writes, reads) = (2u32, 3u32);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = IserSession::connect(
            InitiatorConfig::new("iqn.2026-11.io.blockwire.test:metrics-iser"),
            RdmaConfig::default(),
            iser,
            IQN,
        )
        .await
        .expect("iSER login");
        // TEST UNIT READY takes the new I_T nexus's UNIT ATTENTION (see
        // `traffic`), so that each WRITE below moves its data once.
        s.command(0, &[0u8; 6]).await.expect("TEST UNIT READY");
        let mut buf = s.alloc((BLOCK * BLOCKS) as usize).unwrap();
        buf.write_at(0, &vec![0x3c; buf.len()]).unwrap();
        for i in 0..writes {
            s.write(0, u64::from(i * BLOCKS), BLOCKS, &buf)
                .await
                .expect("iSER WRITE");
        }
        for i in 0..reads {
            let c = s
                .read(0, u64::from((i % writes) * BLOCKS), BLOCKS, &mut buf)
                .await
                .expect("iSER READ");
            assert_eq!(c.transferred, buf.len());
        }
        // The initiator's own counters count its iSER commands as its TCP ones.
        let host = |op: &str| {
            format!(
                "blockwire_initiator_commands_total{{target=\"{IQN}\",\
                 initiator=\"iqn.2026-11.io.blockwire.test:metrics-iser\",op=\"{op}\"}}"
            )
        };
        scrape_until(
            metrics,
            &[
                (host("write"), Some(f64::from(writes))),
                (host("read"), Some(f64::from(reads))),
            ],
        );
        s.logout().await.expect("iSER logout");
    });
    let bytes = f64::from((writes + reads) * BLOCK * BLOCKS);
    let want = [
        ("blockwire_iser_connections_total", 1.0),
        ("blockwire_iser_rdma_reads_total", f64::from(writes)),
        ("blockwire_iser_rdma_writes_total", f64::from(reads)),
        ("blockwire_iser_rdma_bytes_total", bytes),
        ("blockwire_iser_advertised_commands_high", 1.0),
        ("blockwire_iser_staging_bytes_given_up_total", 0.0),
    ];
    let (_, text) = http_get(metrics, "/metrics");
    let wrong: Vec<_> = want
        .iter()
        .filter(|(s, v)| sample(&text, s) != Some(*v))
        .map(|(s, v)| format!("{s}: want {v}, got {:?}", sample(&text, s)))
        .collect();
    assert!(
        wrong.is_empty(),
        "the exposition does not show the iSER traffic:\n{}\n--- exposition ---\n{text}",
        wrong.join("\n")
    );
    // Login, commands, logout: each a Send one way and an answer the other.
    for name in [
        "blockwire_iser_sends_total",
        "blockwire_iser_receives_total",
    ] {
        let n = sample(&text, name).unwrap_or(0.0);
        assert!(n >= f64::from(writes + reads), "{name} {n}\n{text}");
    }
    promtool_check(&text);
    drop(d);
}
