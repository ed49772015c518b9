//! Helpers for end-to-end tests: real target processes on free 127.0.0.1
//! ports (stopped by PID in `Drop`), an in-process target (the target
//! crate's fabric on a free 127.0.0.1 port, [`bind_target`]), a TCP proxy
//! that can cut connections, and random-pattern write/read-back at a queue
//! depth. Examples include this file too (`#[path]`).
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockwire_initiator::{DataDir, Session};
use blockwire_target::iscsi::catalog::{Acl, Catalog};
use blockwire_target::iscsi::portal::Portal;
use blockwire_target::iscsi::{Fabric, FabricSettings};
use blockwire_target::scsi::LogicalUnit;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn build_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("build"))
}

/// The blockwire-target binary: $BLOCKWIRE_TARGET_BIN, else the release
/// build (fast; `cargo build --release -p blockwire-mgmt`), else the debug
/// build of `cargo build --workspace`.
pub fn target_bin() -> (PathBuf, bool) {
    if let Some(p) = std::env::var_os("BLOCKWIRE_TARGET_BIN") {
        return (PathBuf::from(p), true);
    }
    let release = build_dir().join("release/blockwire-target");
    if release.exists() {
        return (release, true);
    }
    let debug = build_dir().join("debug/blockwire-target");
    assert!(
        debug.exists(),
        "no blockwire-target binary: run `cargo build --release -p blockwire-mgmt` \
         (or `cargo build --workspace`) first, or set BLOCKWIRE_TARGET_BIN"
    );
    (debug, false)
}

/// A free port in 20000..32000 (tgtd's control port must be <= 32767).
pub fn free_port() -> u16 {
    let mut rng = rand::thread_rng();
    for _ in 0..1000 {
        let p: u16 = rng.gen_range(20000..32000);
        if Path::new(&format!("/var/run/tgtd/socket.{p}")).exists() {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port in 20000..32000");
}

/// Waits (bounded) until something accepts on the port.
pub fn wait_port(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited early with {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on 127.0.0.1:{port} within 20 s");
}

/// A process killed by PID when dropped.
pub struct Daemon {
    child: Child,
    name: String,
    cleanup: Vec<PathBuf>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for p in &self.cleanup {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Daemon {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The name given at start.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "blockwire-e2e-{tag}-{}-{}",
            std::process::id(),
            rand::thread_rng().gen::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// blockwire-target on a free port; `config` is TOML (None: the embedded
/// default target iqn.2026-11.io.blockwire:default, 1 GiB RAM LUN 0).
pub fn start_blockwire(config: Option<&str>, scratch: &Scratch) -> (Daemon, u16) {
    let (d, port, _) = start_blockwire_logging(config, scratch, "warn");
    (d, port)
}

/// [`start_blockwire`] logging at `level` (BLOCKWIRE_LOG) to the file whose
/// path it also returns.
pub fn start_blockwire_logging(
    config: Option<&str>,
    scratch: &Scratch,
    level: &str,
) -> (Daemon, u16, PathBuf) {
    let (bin, _) = target_bin();
    let port = free_port();
    let mut cmd = Command::new(&bin);
    cmd.arg("--listen").arg(format!("127.0.0.1:{port}"));
    if let Some(c) = config {
        let path = scratch.0.join(format!("target-{port}.toml"));
        std::fs::write(&path, c).expect("write config");
        cmd.arg("--config").arg(path);
    }
    let log_path = scratch.0.join(format!("target-{port}.log"));
    let log = std::fs::File::create(&log_path).expect("log");
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .env("BLOCKWIRE_LOG", level);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    wait_port(port, &mut child, "blockwire-target");
    (
        Daemon {
            child,
            name: "blockwire-target".into(),
            cleanup: Vec::new(),
        },
        port,
        log_path,
    )
}

/// An in-process target, accepting connections.
pub struct TestTarget {
    /// Where its portal listens.
    pub addr: std::net::SocketAddr,
    /// Its fabric (data path registries, RDMA service, statistics).
    pub fabric: Arc<Fabric>,
    /// Sending true shuts the target down.
    pub stop: watch::Sender<bool>,
}

impl TestTarget {
    /// Opens an iSER portal (RFC 7145) for portal group 1 on the soft RDMA provider, on a
    /// free port of 127.0.0.1; where it listens.
    pub async fn start_iser(&self) -> std::net::SocketAddr {
        blockwire_target::iscsi::iser::start(
            self.fabric.clone(),
            "127.0.0.1:0".parse().unwrap(),
            blockwire_transport::rdma::any::Backend::Soft,
            None,
            1,
        )
        .await
        .expect("an iSER portal on the soft RDMA provider")
    }
}

/// An in-process target bound to its port but not accepting yet: set up
/// its fabric (e.g. put the LUN on a data path), then [`Self::serve`].
pub struct BoundTarget {
    portal: Portal,
    /// Where its portal listens.
    pub addr: std::net::SocketAddr,
    /// Its fabric.
    pub fabric: Arc<Fabric>,
    stop: watch::Sender<bool>,
}

impl BoundTarget {
    /// Starts the RDMA offload service (soft provider, a free port of
    /// 127.0.0.1) when `rdma`, then accepts connections.
    pub async fn serve(self, rdma: bool) -> TestTarget {
        if rdma {
            self.fabric
                .start_rdma("127.0.0.1:0".parse().unwrap())
                .await
                .unwrap();
        }
        tokio::spawn(self.portal.run(self.fabric.clone()));
        TestTarget {
            addr: self.addr,
            fabric: self.fabric,
            stop: self.stop,
        }
    }
}

/// An in-process target named `name` whose only LUN, 0, is `lu`, open to
/// any initiator, bound to a free port of 127.0.0.1.
pub async fn bind_target(name: &str, lu: LogicalUnit, settings: FabricSettings) -> BoundTarget {
    let portal = Portal::bind("127.0.0.1:0".parse().unwrap(), 1)
        .await
        .unwrap();
    let addr = portal.local_addr().unwrap();
    let catalog = Catalog::one_target(name, addr, Acl::Any, Arc::new(lu));
    let (stop, shutdown) = watch::channel(false);
    let fabric = Fabric::new(Arc::new(catalog), settings, shutdown);
    BoundTarget {
        portal,
        addr,
        fabric,
        stop,
    }
}

/// Whether tgtd is installed.
pub fn have_tgtd() -> bool {
    Command::new("tgtd")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Runs tgtadm against the tgtd on `port`.
pub fn tgtadm(port: u16, args: &[&str]) {
    let out = Command::new("tgtadm")
        .arg("-C")
        .arg(port.to_string())
        .arg("--lld")
        .arg("iscsi")
        .args(args)
        .output()
        .expect("run tgtadm");
    assert!(
        out.status.success(),
        "tgtadm {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// tgtd with control port = iSCSI port, target `iqn` (tid 1) and LUN 1
/// backed by a `size_mib` file in /dev/shm, open to all initiators.
pub fn start_tgtd(iqn: &str, size_mib: u64, scratch: &Scratch) -> (Daemon, u16) {
    let port = free_port();
    let log = std::fs::File::create(scratch.0.join(format!("tgtd-{port}.log"))).expect("log");
    let mut child = Command::new("tgtd")
        .args(["-f", "-C", &port.to_string(), "--iscsi"])
        .arg(format!("portal=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start tgtd");
    wait_port(port, &mut child, "tgtd");
    // The control socket may come up a little after the portal.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Command::new("tgtadm")
        .args(["-C", &port.to_string(), "--op", "show", "--mode", "sys"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "tgtd control socket did not come up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let backing = PathBuf::from(format!(
        "/dev/shm/blockwire-e2e-tgtd-{port}-{}.img",
        std::process::id()
    ));
    let f = std::fs::File::create(&backing).expect("backing file");
    f.set_len(size_mib << 20).expect("size backing file");
    let daemon = Daemon {
        child,
        name: "tgtd".into(),
        cleanup: vec![
            backing.clone(),
            PathBuf::from(format!("/var/run/tgtd/socket.{port}")),
            PathBuf::from(format!("/var/run/tgtd/socket.{port}.lock")),
        ],
    };
    tgtadm(
        port,
        &["--op", "new", "--mode", "target", "--tid", "1", "-T", iqn],
    );
    tgtadm(
        port,
        &[
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "-b",
            backing.to_str().expect("utf-8 path"),
        ],
    );
    tgtadm(
        port,
        &[
            "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
        ],
    );
    (daemon, port)
}

/// A TCP proxy on a free port to `upstream`, able to cut every connection
/// it carries (both directions, like a failed link).
pub struct Proxy {
    pub port: u16,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy bind");
        let port = listener.local_addr().expect("addr").port();
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let c2 = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                let Ok(mut up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let _ = down.set_nodelay(true);
                let _ = up.set_nodelay(true);
                let h = tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                });
                c2.lock().unwrap().push(h.abort_handle());
            }
        });
        Proxy {
            port,
            conns,
            accept,
        }
    }

    /// Cuts every open connection; returns how many.
    pub fn cut(&self) -> usize {
        let mut v = self.conns.lock().unwrap();
        let n = v.iter().filter(|h| !h.is_finished()).count();
        for h in v.drain(..) {
            h.abort();
        }
        n
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// What a [`DataInTap`] saw on the target-to-initiator stream.
#[derive(Debug, Default)]
pub struct DataInCounts {
    /// Data-In PDUs.
    pub data_in: std::sync::atomic::AtomicU64,
    /// Data-In PDUs whose BufferOffset is lower than the offset of an
    /// earlier Data-In of the same task: PDUs that left out of order.
    pub backward: std::sync::atomic::AtomicU64,
    /// Tasks with at least one backward PDU.
    pub reordered_tasks: std::sync::atomic::AtomicU64,
}

/// A TCP proxy on a free port to `upstream` that forwards both directions
/// unchanged and parses the target's PDUs on the way (no digests: the
/// sessions through it must not negotiate any) to count Data-In PDUs that
/// left out of BufferOffset order, per task (ITT) from its first Data-In to
/// its status.
pub struct DataInTap {
    pub port: u16,
    pub counts: Arc<DataInCounts>,
    accept: tokio::task::JoinHandle<()>,
}

impl DataInTap {
    pub async fn start(upstream: std::net::SocketAddr) -> DataInTap {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("tap bind");
        let port = listener.local_addr().expect("addr").port();
        let counts = Arc::new(DataInCounts::default());
        let c2 = counts.clone();
        let accept = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let _ = down.set_nodelay(true);
                let _ = up.set_nodelay(true);
                let (mut down_r, mut down_w) = down.into_split();
                let (mut up_r, mut up_w) = up.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut down_r, &mut up_w).await;
                    let _ = up_w.shutdown().await;
                });
                let counts = c2.clone();
                tokio::spawn(async move {
                    let mut parser = DataInParser::default();
                    let mut chunk = vec![0u8; 256 << 10];
                    loop {
                        let n = match up_r.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        parser.feed(&chunk[..n], &counts);
                        if down_w.write_all(&chunk[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = down_w.shutdown().await;
                });
            }
        });
        DataInTap {
            port,
            counts,
            accept,
        }
    }

    /// Data-In PDUs that left with a lower BufferOffset than an earlier
    /// one of the same task.
    pub fn backward(&self) -> u64 {
        self.counts
            .backward
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for DataInTap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Splits the target's byte stream into PDUs (BHS, AHS, padded data
/// segment; no digests) and follows each task's Data-In offsets.
#[derive(Default)]
struct DataInParser {
    buf: Vec<u8>,
    /// ITT -> highest BufferOffset seen so far, and whether the task
    /// already counted as reordered.
    tasks: std::collections::HashMap<u32, (u32, bool)>,
}

impl DataInParser {
    fn feed(&mut self, bytes: &[u8], counts: &DataInCounts) {
        use std::sync::atomic::Ordering::SeqCst;
        self.buf.extend_from_slice(bytes);
        let mut at = 0;
        while self.buf.len() - at >= 48 {
            let h = &self.buf[at..at + 48];
            let ahs = usize::from(h[4]) * 4;
            let dsl = (usize::from(h[5]) << 16) | (usize::from(h[6]) << 8) | usize::from(h[7]);
            let total = 48 + ahs + dsl.next_multiple_of(4);
            if self.buf.len() - at < total {
                break;
            }
            let itt = u32::from_be_bytes(h[16..20].try_into().unwrap());
            match h[0] & 0x3f {
                // Data-In
                0x25 => {
                    counts.data_in.fetch_add(1, SeqCst);
                    let offset = u32::from_be_bytes(h[40..44].try_into().unwrap());
                    let e = self.tasks.entry(itt).or_insert((offset, false));
                    if offset < e.0 {
                        counts.backward.fetch_add(1, SeqCst);
                        if !e.1 {
                            e.1 = true;
                            counts.reordered_tasks.fetch_add(1, SeqCst);
                        }
                    }
                    e.0 = e.0.max(offset);
                    // S bit: the status rides on it, the task is over.
                    if h[1] & 0x01 != 0 {
                        self.tasks.remove(&itt);
                    }
                }
                // SCSI Response
                0x21 => {
                    self.tasks.remove(&itt);
                }
                _ => {}
            }
            at += total;
        }
        self.buf.drain(..at);
    }
}

/// A deterministic random pattern of `len` bytes (a multiple of 512):
/// one random MiB repeated, with every 512-byte block stamped with the seed
/// and its index, so that misplaced or stale blocks show. Cheap to build
/// even in debug builds.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut base = vec![0u8; 1 << 20];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut base[..]);
    let mut v = vec![0u8; len];
    for (i, chunk) in v.chunks_mut(1 << 20).enumerate() {
        let n = chunk.len();
        chunk.copy_from_slice(&base[..n]);
        for (j, b) in chunk.chunks_mut(512).enumerate() {
            let idx = ((i << 11) + j) as u64;
            b[..8].copy_from_slice(&seed.to_le_bytes());
            b[8..16].copy_from_slice(&idx.to_le_bytes());
        }
    }
    v
}

/// Cuts `total_blocks` into commands of 1..=max_blocks blocks (random).
pub fn chunks(total_blocks: u64, max_blocks: u32, seed: u64) -> Vec<(u64, u32)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut lba = 0;
    while lba < total_blocks {
        let n = rng
            .gen_range(1..=max_blocks)
            .min((total_blocks - lba) as u32);
        out.push((lba, n));
        lba += u64::from(n);
    }
    out
}

/// Writes `data` to `lun` from LBA `base` with `qd` workers, in commands of
/// random sizes up to `max_blocks` blocks; returns how many commands ran.
pub async fn write_all(
    s: &Arc<Session>,
    lun: u16,
    base: u64,
    block: usize,
    data: &Arc<Vec<u8>>,
    qd: usize,
    max_blocks: u32,
) -> usize {
    let list = chunks((data.len() / block) as u64, max_blocks, data.len() as u64);
    let n = list.len();
    let queue = Arc::new(Mutex::new(list));
    let mut workers = Vec::new();
    for _ in 0..qd {
        let (s, data, queue) = (s.clone(), data.clone(), queue.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let Some((lba, blocks)) = queue.lock().unwrap().pop() else {
                    return;
                };
                let at = lba as usize * block;
                let end = at + blocks as usize * block;
                s.write(lun, base + lba, blocks, &data[at..end])
                    .await
                    .unwrap_or_else(|e| panic!("WRITE lba {lba} x{blocks}: {e}"));
            }
        }));
    }
    for w in workers {
        w.await.expect("writer task");
    }
    n
}

/// Reads `len` bytes of `lun` from LBA `base` with `qd` workers in 1 MiB
/// commands, each straight into its own buffer; returns the bytes in order.
pub async fn read_all(
    s: &Arc<Session>,
    lun: u16,
    base: u64,
    block: usize,
    len: usize,
    qd: usize,
) -> Vec<u8> {
    let per = (1 << 20) / block;
    let total = len / block;
    let list: Vec<(u64, u32)> = (0..total)
        .step_by(per)
        .map(|b| (b as u64, per.min(total - b) as u32))
        .collect();
    let queue = Arc::new(Mutex::new(list));
    let mut workers = Vec::new();
    for _ in 0..qd {
        let (s, queue) = (s.clone(), queue.clone());
        workers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let Some((lba, blocks)) = queue.lock().unwrap().pop() else {
                    return got;
                };
                let mut buf = vec![0u8; blocks as usize * block];
                let c = s
                    .execute(
                        lun,
                        &blockwire_initiator::rw16(false, base + lba, blocks, false),
                        DataDir::Read(&mut buf),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("READ lba {lba} x{blocks}: {e}"));
                assert_eq!(c.transferred, buf.len());
                got.push((lba, buf));
            }
        }));
    }
    let mut out = vec![0u8; len];
    for w in workers {
        for (lba, buf) in w.await.expect("reader task") {
            let at = lba as usize * block;
            out[at..at + buf.len()].copy_from_slice(&buf);
        }
    }
    out
}

/// CRC32C of a buffer, as a printable checksum.
pub fn checksum(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

/// Waits until connecting to `addr` is refused (a listener closed), failing
/// after 10 s with `what` named.
pub async fn wait_until_refused(addr: std::net::SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "{what} {addr} still accepts 10 s after shutdown"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
