//! The engine READ path end to end, against an
//! in-process blockwire fabric with a file LUN: a session that negotiated
//! DataPDUInOrder=No reads back what it wrote (PDUs placed by BufferOffset)
//! and a tap on the wire sees Data-In PDUs leave out of BufferOffset order,
//! the serial baseline on the same path does too, an RDMA-offloaded READ on
//! a synchronized LUN is placed one RDMA Write per chunk, and every served
//! READ lands in the LUN's state-timer histograms with phases that add up.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use blockwire_initiator::rdma::{AssistedSession, Mode as RdmaMode, RdmaConfig};
use blockwire_initiator::{InitiatorConfig, Session};
use blockwire_target::backstore::{FileBackstore, FileMode};
use blockwire_target::datapath::{
    completion_channel, open_engine, BufferPool, CompletionTx, Engine, EngineKind, EnginePref,
    IoOp, Mode, Phase, PhaseStats,
};
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use support::*;

const TARGET: &str = "iqn.2026-11.io.blockwire:sync-send";
const BS: usize = 512;
const LUN_BYTES: u64 = 32 << 20;

/// A fabric with one file LUN read through the engine path in `mode` with
/// `chunk`-byte chunks (on the pread thread pool when `threads`, whose
/// workers finish chunks in any order); RDMA offload offered when `rdma`.
async fn start(mode: Mode, chunk: usize, rdma: bool, threads: bool) -> (TestTarget, Scratch) {
    start_with(mode, chunk, rdma, threads, FabricSettings::default()).await
}

/// [`start`] on a given engine.
async fn start_on(mode: Mode, chunk: usize, engine: Arc<dyn Engine>) -> (TestTarget, Scratch) {
    start_engine(mode, chunk, false, Some(engine), FabricSettings::default()).await
}

/// [`start`] with explicit fabric settings.
async fn start_with(
    mode: Mode,
    chunk: usize,
    rdma: bool,
    threads: bool,
    settings: FabricSettings,
) -> (TestTarget, Scratch) {
    let engine = threads.then(|| {
        open_engine(BufferPool::with_defaults(), EnginePref::ThreadPool)
            .unwrap()
            .0
    });
    start_engine(mode, chunk, rdma, engine, settings).await
}

/// [`start_with`] on `engine` (the fabric's own, io_uring where the kernel
/// has it, when None).
async fn start_engine(
    mode: Mode,
    chunk: usize,
    rdma: bool,
    engine: Option<Arc<dyn Engine>>,
    settings: FabricSettings,
) -> (TestTarget, Scratch) {
    let dir = Scratch::new("sync-send");
    let path = dir.0.join("lun0.img");
    let fb = FileBackstore::open_with(&path, Some(LUN_BYTES), false, FileMode::Direct).unwrap();
    let direct = fb.mode() == FileMode::Direct;
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(fb)));
    let t = bind_target(TARGET, lu, settings).await;
    if let Some(e) = engine {
        let banner = e.describe();
        t.fabric.sync_reads.set_engine(e, banner);
    }
    let line = t
        .fabric
        .sync_reads
        .enable(TARGET, 0, &path, direct, chunk, mode)
        .unwrap();
    eprintln!("LUN 0: {line}");
    (t.serve(rdma).await, dir)
}

fn lun_stats(t: &TestTarget) -> Arc<PhaseStats> {
    let all = t.fabric.sync_reads.stats();
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].0.as_str(), all[0].1), (TARGET, 0));
    all[0].2.clone()
}

/// Every served READ is in the histograms, and its phases add up:
/// init + disk read + send not overlapped + finish = total, summed over
/// the commands (send setup overlaps the disk read).
fn check_stats(s: &PhaseStats, reads: u64, bytes: u64) {
    assert_eq!(s.histogram(Phase::Total).count(), reads);
    assert_eq!(s.bytes.load(Ordering::Relaxed), bytes);
    let parts: Duration = [
        Phase::Init,
        Phase::DiskRead,
        Phase::SendUnoverlapped,
        Phase::Fin,
    ]
    .iter()
    .map(|&p| s.histogram(p).sum())
    .sum();
    assert_eq!(parts, s.histogram(Phase::Total).sum());
    assert!(s.histogram(Phase::DiskRead).sum() > Duration::ZERO);
}

async fn write_read_back(t: &TestTarget, cfg: InitiatorConfig, len: usize, seed: u64) -> Session {
    let s = Arc::new(
        Session::connect(cfg, &t.addr.to_string(), TARGET)
            .await
            .unwrap(),
    );
    let data = Arc::new(pattern(len, seed));
    write_all(&s, 0, 0, BS, &data, 8, 2048).await;
    let got = read_all(&s, 0, 0, BS, len, 8).await;
    assert!(
        checksum(&got) == checksum(&data) && got == *data,
        "read back differs from what was written"
    );
    match Arc::try_unwrap(s) {
        Ok(s) => s,
        Err(_) => panic!("a worker still holds the session"),
    }
}

/// Which engine a test's LUN reads through.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Eng {
    /// The pread thread pool (4 workers finishing chunks in any order).
    Threads,
    /// io_uring READ_FIXED on the O_DIRECT file, its completions of each
    /// batch handed to the target last first ([`Reversed`]): on this kind
    /// of virtual disk io_uring completes O_DIRECT reads in submission
    /// order, so only this makes the completion order deterministic.
    UringReversed,
}

/// An engine whose completions of each submitted batch reach the target in
/// reverse order: every op of the batch runs on `inner`, a helper thread
/// collects their completions and delivers them last first. A deterministic
/// completion order other than the offset order.
struct Reversed {
    inner: Arc<dyn Engine>,
    batches: std::sync::atomic::AtomicU64,
}

impl Engine for Reversed {
    fn kind(&self) -> EngineKind {
        self.inner.kind()
    }
    fn describe(&self) -> String {
        format!(
            "{}, each batch's completions delivered last first",
            self.inner.describe()
        )
    }
    fn pool(&self) -> &BufferPool {
        self.inner.pool()
    }
    fn submit(&self, ops: Vec<IoOp>, done: &CompletionTx) -> std::io::Result<()> {
        let n = ops.len();
        if n > 1 {
            self.batches.fetch_add(1, Ordering::Relaxed);
        }
        let (tx, mut rx) = completion_channel();
        let r = self.inner.submit(ops, &tx);
        drop(tx);
        let done = done.clone();
        std::thread::spawn(move || {
            let mut got = Vec::with_capacity(n);
            // Until every op completed (or the engine dropped the rest
            // after a failed submission).
            while got.len() < n {
                match rx.blocking_recv() {
                    Some(c) => got.push(c),
                    None => break,
                }
            }
            for c in got.into_iter().rev() {
                let _ = done.send(c);
            }
        });
        r
    }
}

/// A DataPDUInOrder=No session reads back what it wrote, through a tap
/// that watches every Data-In PDU on the wire: at least one must leave with
/// a lower BufferOffset than an earlier PDU of the same READ (the target
/// sends in completion order within a sequence), and the target's own
/// counter agrees that PDUs left out of order.
async fn unordered_reads_leave_out_of_order(eng: Eng) {
    // 16 KiB chunks under 8 KiB PDUs: two PDUs per chunk, 64 chunks per
    // 1 MiB READ, completing in whatever order the engine finishes. 64 MiB
    // read at queue depth 8 (64 READs, 8192 Data-In PDUs) on the O_DIRECT
    // file, so that the engine has many chunks in flight at once.
    let mut reversed = None;
    let (t, _dir) = match eng {
        Eng::Threads => start(Mode::Synchronized, 16 << 10, false, true).await,
        Eng::UringReversed => {
            let inner = match open_engine(BufferPool::with_defaults(), EnginePref::IoUring) {
                Ok((e, _)) => e,
                Err(e) if no_io_uring_allowed() => {
                    eprintln!("io_uring unavailable ({e}), BLOCKWIRE_ALLOW_NO_IO_URING=1");
                    open_engine(BufferPool::with_defaults(), EnginePref::ThreadPool)
                        .unwrap()
                        .0
                }
                Err(e) => panic!(
                    "io_uring unavailable: {e} (set BLOCKWIRE_ALLOW_NO_IO_URING=1 only where \
                     io_uring is missing)"
                ),
            };
            let r = Arc::new(Reversed {
                inner,
                batches: Default::default(),
            });
            reversed = Some(r.clone());
            start_on(Mode::Synchronized, 16 << 10, r).await
        }
    };
    let (engine, banner) = t.fabric.sync_reads.engine().unwrap();
    eprintln!("engine: {banner}");
    if eng == Eng::Threads {
        assert_eq!(engine.kind(), EngineKind::ThreadPool, "{banner}");
    } else if !no_io_uring_allowed() {
        assert_eq!(engine.kind(), EngineKind::IoUring, "{banner}");
    }
    let path = t.fabric.sync_reads.get(TARGET, 0).unwrap();
    assert!(
        format!("{path:?}").contains("direct: true"),
        "the LUN reads O_DIRECT: {path:?}"
    );
    let tap = DataInTap::start(t.addr).await;
    let mut cfg =
        InitiatorConfig::new("iqn.2026-11.io.blockwire:unordered").with_data_pdu_in_order(false);
    cfg.max_recv_data_segment_length = 8192;
    // 32 KiB sequences (MaxBurstLength): a chunk of a later sequence that
    // completes first waits, with its bytes, until the sequences before it
    // were sent (DataSequenceInOrder=Yes).
    cfg.max_burst_length = 32 << 10;
    let len = LUN_BYTES as usize * 2;
    let s = Arc::new(
        Session::connect(cfg, &format!("127.0.0.1:{}", tap.port), TARGET)
            .await
            .unwrap(),
    );
    assert!(
        !s.params().data_pdu_in_order,
        "DataPDUInOrder=No negotiated"
    );
    let data = Arc::new(pattern(LUN_BYTES as usize, 7));
    write_all(&s, 0, 0, BS, &data, 8, 2048).await;
    let mut reads = 0;
    for _ in 0..len / data.len() {
        let got = read_all(&s, 0, 0, BS, data.len(), 8).await;
        reads += (data.len() >> 20) as u64;
        assert!(
            checksum(&got) == checksum(&data) && got == *data,
            "read back differs from what was written"
        );
    }
    match Arc::try_unwrap(s) {
        Ok(s) => s.logout().await.unwrap(),
        Err(_) => panic!("a worker still holds the session"),
    }
    check_stats(&lun_stats(&t), reads, reads << 20);
    let c = &tap.counts;
    let data_in = c.data_in.load(Ordering::SeqCst);
    let backward = tap.backward();
    let tasks = c.reordered_tasks.load(Ordering::SeqCst);
    let target_count = path.reordered_pdus.load(Ordering::Relaxed);
    eprintln!(
        "{eng:?}: {data_in} Data-In PDUs on the wire, {backward} with a lower BufferOffset \
         than an earlier one of the same READ, in {tasks} of {reads} READs; target's \
         reordered-PDU counter {target_count}; {}",
        t.fabric.sync_reads.summary().join("; ")
    );
    // Every READ's 128 PDUs (plus the WRITEs' responses) crossed the tap.
    assert!(data_in >= reads * 128, "{data_in} Data-In PDUs seen");
    assert!(
        backward >= 1,
        "no Data-In PDU left out of order in {reads} READs with DataPDUInOrder=No"
    );
    // The target's counter counts jumps (a PDU not starting where the
    // previous one ended), the tap every PDU below the highest offset so
    // far: both see the reordering.
    assert!(target_count >= 1, "the target counted no reordered PDU");
    if let Some(r) = reversed {
        // Every READ was submitted in batches of several chunks whose
        // completions came last first: every READ is reordered on the wire.
        let batches = r.batches.load(Ordering::Relaxed);
        assert!(
            batches >= reads,
            "{batches} multi-op batches for {reads} READs"
        );
        assert_eq!(tasks, reads, "READs with PDUs out of order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_pdu_in_order_no_sends_out_of_order_on_the_thread_pool() {
    tokio::time::timeout(
        Duration::from_secs(120),
        unordered_reads_leave_out_of_order(Eng::Threads),
    )
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_pdu_in_order_no_sends_in_completion_order_on_io_uring() {
    tokio::time::timeout(
        Duration::from_secs(120),
        unordered_reads_leave_out_of_order(Eng::UringReversed),
    )
    .await
    .expect("test timed out");
}

fn no_io_uring_allowed() -> bool {
    std::env::var("BLOCKWIRE_ALLOW_NO_IO_URING").is_ok_and(|v| v == "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_order_by_default_and_the_serial_baseline() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let (t, _dir) = start(Mode::Serial, 64 << 10, false, false).await;
        let cfg = InitiatorConfig::new("iqn.2026-11.io.blockwire:ordered");
        let len = 8 << 20;
        let s = write_read_back(&t, cfg, len, 11).await;
        assert!(s.params().data_pdu_in_order, "the initiator offered Yes");
        s.logout().await.unwrap();
        let path = t.fabric.sync_reads.get(TARGET, 0).unwrap();
        assert_eq!(path.reordered_pdus.load(Ordering::Relaxed), 0);
        let st = lun_stats(&t);
        check_stats(&st, (len >> 20) as u64, len as u64);
        // Serial: nothing is sent before the whole read is done, so the
        // send time is all unoverlapped and the disk read phase holds it all.
        assert!(st.histogram(Phase::SendUnoverlapped).sum() > Duration::ZERO);
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_reads_are_placed_one_write_per_chunk() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let chunk = 64 << 10;
        let (t, _dir) = start(Mode::Synchronized, chunk, true, true).await;
        let cfg = InitiatorConfig::new("iqn.2026-11.io.blockwire:rdma-sync");
        let s = AssistedSession::connect(cfg, RdmaConfig::default(), &t.addr.to_string(), TARGET)
            .await
            .unwrap();
        assert_eq!(s.mode().await, RdmaMode::Offloaded);
        let len = 4 << 20;
        let data = pattern(len, 3);
        // Written over plain iSCSI so only the READ goes by RDMA Write.
        s.session()
            .write(0, 0, (len / BS) as u32, &data)
            .await
            .unwrap();
        let counters = t.fabric.rdma.get().unwrap().counters();
        let writes_before = counters.rdma_writes.load(Ordering::Relaxed);
        let mut r = s.alloc(len).unwrap();
        let c = s.read(0, 0, (len / BS) as u32, &mut r).await.unwrap();
        assert_eq!(c.transferred, len);
        assert!(r.to_vec() == data, "RDMA-placed data differ");
        let writes = counters.rdma_writes.load(Ordering::Relaxed) - writes_before;
        assert!(
            writes >= (len / chunk) as u64,
            "{writes} RDMA Writes for {} chunks",
            len / chunk
        );
        assert_eq!(counters.failed_transfers.load(Ordering::Relaxed), 0);
        assert_eq!(s.stats().offloaded_reads, 1);
        s.logout().await.unwrap();
        check_stats(&lun_stats(&t), 1, len as u64);
    })
    .await
    .expect("test timed out");
}

/// The daemon as configured from TOML (release build when present): a
/// striped direct LUN with synchronized sends, a DataPDUInOrder=No session
/// and an RDMA-offloaded session read back what was written, and SIGTERM
/// logs the LUN's state-timer summary. These are the settings the
/// all-modes integrity test uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_striped_sync_send_unordered_and_rdma() {
    use std::process::{Command, Stdio};
    let scratch = Scratch::new("sync-send-daemon");
    let paths: Vec<String> = (0..3)
        .map(|m| format!("{:?}", scratch.0.join(format!("m{m}.img"))))
        .collect();
    let config = format!(
        "[fabric]\nrdma_listen = \"127.0.0.1:0\"\n\n\
         [[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
         [[target]]\nname = \"{TARGET}\"\n\n\
         [[target.lun]]\nid = 0\nbackstore = \"striped\"\npaths = [{}]\nstripe_chunk = \"64K\"\n\
         size = \"48M\"\nmode = \"direct\"\nsync_send = true\nsync_chunk = \"16K\"\n",
        paths.join(", ")
    );
    let (bin, _) = target_bin();
    let port = free_port();
    let cfg_path = scratch.0.join("target.toml");
    std::fs::write(&cfg_path, &config).unwrap();
    let log = scratch.0.join("target.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(&bin)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .env("BLOCKWIRE_LOG", "info")
        .spawn()
        .unwrap();
    // Killed by PID on drop (the test's own child only).
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(child);
    wait_port(port, &mut child.0, "blockwire-target");
    let portal = format!("127.0.0.1:{port}");
    tokio::time::timeout(Duration::from_secs(120), async {
        let mut cfg = InitiatorConfig::new("iqn.2026-11.io.blockwire:daemon-unordered")
            .with_data_pdu_in_order(false);
        cfg.max_recv_data_segment_length = 8192;
        let s = Arc::new(Session::connect(cfg, &portal, TARGET).await.unwrap());
        assert!(!s.params().data_pdu_in_order);
        let len = 32 << 20;
        let data = Arc::new(pattern(len, 21));
        write_all(&s, 0, 0, BS, &data, 8, 2048).await;
        let got = read_all(&s, 0, 0, BS, len, 8).await;
        assert!(got == *data, "DataPDUInOrder=No read back differs");
        let s = match Arc::try_unwrap(s) {
            Ok(s) => s,
            Err(_) => panic!("a worker still holds the session"),
        };
        s.logout().await.unwrap();

        let cfg = InitiatorConfig::new("iqn.2026-11.io.blockwire:daemon-rdma");
        let s = AssistedSession::connect(cfg, RdmaConfig::default(), &portal, TARGET)
            .await
            .unwrap();
        assert_eq!(s.mode().await, RdmaMode::Offloaded);
        let n = 4 << 20;
        let mut r = s.alloc(n).unwrap();
        let c = s.read(0, 64, (n / BS) as u32, &mut r).await.unwrap();
        assert_eq!(c.transferred, n);
        let at = 64 * BS;
        assert!(r.to_vec()[..] == data[at..at + n], "RDMA read back differs");
        assert_eq!(s.stats().offloaded_reads, 1);
        s.logout().await.unwrap();
    })
    .await
    .expect("test timed out");
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.0.id().to_string())
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("READ state timers")) {
            eprintln!("{line}");
            // 32 x 1 MiB READs over TCP and one over RDMA.
            assert!(line.contains("33 READs"), "{line}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no state-timer summary at shutdown; log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The other direction of DataPDUInOrder=No: the target's Data-Out
/// collector places PDUs of one sequence in any order by BufferOffset
/// (DataSN still counts sends, F on the PDU that completes the sequence),
/// refuses overlaps, and with Yes refuses a jump.
#[test]
fn data_out_in_any_order_when_negotiated_no() {
    use blockwire_target::iscsi::dataout::{DataOutError, WriteCollector, WriteLimits};
    let limits = |in_order| WriteLimits {
        first_burst_length: 65536,
        max_burst_length: 1 << 20,
        initial_r2t: true,
        immediate_data: false,
        max_outstanding_r2t: 1,
        data_pdu_in_order: in_order,
    };
    let data = pattern(24 << 10, 5);
    let piece = |i: usize| &data[i * 8192..(i + 1) * 8192];
    let mut c = WriteCollector::new(24 << 10, &[], true, limits(false)).unwrap();
    let r2t = c.next_r2ts(|| 9);
    assert_eq!((r2t.len(), r2t[0].length), (1, 24 << 10));
    c.on_data_out(9, 0, 16384, piece(2), false).unwrap();
    assert!(matches!(
        c.on_data_out(9, 1, 12288, piece(1), false),
        Err(DataOutError::BadOffset { .. })
    ));
    c.on_data_out(9, 1, 0, piece(0), false).unwrap();
    c.on_data_out(9, 2, 8192, piece(1), true).unwrap();
    assert!(c.is_complete());
    assert!(c.into_data() == data);

    let mut c = WriteCollector::new(24 << 10, &[], true, limits(true)).unwrap();
    c.next_r2ts(|| 9);
    assert!(matches!(
        c.on_data_out(9, 0, 16384, piece(2), false),
        Err(DataOutError::BadOffset { .. })
    ));
}

/// `[fabric] data_pdu_in_order = true` makes the target answer Yes, so an
/// initiator that offers No still gets in-order Data-In.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_target_can_insist_on_in_order_pdus() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let settings = FabricSettings {
            data_pdu_in_order: true,
            ..FabricSettings::default()
        };
        let (t, _dir) = start_with(Mode::Synchronized, 16 << 10, false, true, settings).await;
        let mut cfg =
            InitiatorConfig::new("iqn.2026-11.io.blockwire:insisted").with_data_pdu_in_order(false);
        cfg.max_recv_data_segment_length = 8192;
        let s = write_read_back(&t, cfg, 4 << 20, 13).await;
        assert!(s.params().data_pdu_in_order, "the target answered Yes");
        s.logout().await.unwrap();
        let path = t.fabric.sync_reads.get(TARGET, 0).unwrap();
        assert_eq!(path.reordered_pdus.load(Ordering::Relaxed), 0);
    })
    .await
    .expect("test timed out");
}
