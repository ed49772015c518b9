//! Double-buffered WRITEs (`sync_write`, target/src/iscsi/syncwrite.rs)
//! over real sockets: an in-process target on 127.0.0.1:0 with a file LUN
//! written by the I/O engine, driven by the raw test initiator so the test
//! decides when each Data-Out leaves.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use blockwire_pdu::keys::SessionParams;
use blockwire_pdu::pdu::codes::{TmfFunction, TmfResponse};
use blockwire_pdu::pdu::{DataOut, R2t, ScsiCommand, TaskMgmtRequest, RESERVED_TAG};
use blockwire_pdu::scsi::{Asc, Sense, SenseKey};
use blockwire_pdu::{Bhs, Digests, Pdu};
use blockwire_target::backstore::{FileBackstore, FileMode};
use blockwire_target::datapath::{
    open_engine, BufferPool, Completion, CompletionTx, Engine, EngineKind, EnginePref, IoOp, OpKind,
};
use blockwire_target::iscsi::catalog::Acl;
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::stats::Direction;
use blockwire_target::scsi::{LogicalUnit, LuConfig};

mod support;
use support::{bind_target, lun0_command, rw10, RawConn, TestTarget};

const TARGET: &str = "iqn.2026-11.io.blockwire:sync-write-test";
const INITIATOR: &str = "iqn.2026-11.io.blockwire:sync-write-initiator";
const CHUNK: usize = 64 << 10;

/// A target whose LUN 0 is the file `lun_file` (`size` bytes, `mode`)
/// with double-buffered writes through `engine` to `engine_file` (the
/// same file, except in the error test).
async fn start(
    lun_file: &Path,
    size: u64,
    mode: FileMode,
    engine_file: &Path,
    engine: Arc<dyn Engine>,
) -> TestTarget {
    let store = FileBackstore::open_with(lun_file, Some(size), false, mode).unwrap();
    let direct = store.mode() == FileMode::Direct;
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(store)));
    // No NOP-In pings: the raw client does not answer them, and a loaded
    // machine can take longer than the default interval over 64 MiB.
    let settings = FabricSettings {
        nop_interval: None,
        ..FabricSettings::default()
    };
    let t = bind_target(TARGET, Acl::Any, lu, settings).await;
    t.fabric
        .sync_writes
        .enable(engine, TARGET, 0, engine_file, direct, CHUNK)
        .unwrap();
    t.serve()
}

/// [`start`] of an 8 MiB page-cached LUN written through the default engine.
async fn start_cached(lun_file: &Path, engine_file: &Path) -> TestTarget {
    let pool = BufferPool::with_defaults();
    start(
        lun_file,
        8 << 20,
        FileMode::Cached,
        engine_file,
        engine(pool),
    )
    .await
}

fn engine(pool: BufferPool) -> Arc<dyn Engine> {
    open_engine(pool, EnginePref::Auto).unwrap().0
}

struct Client {
    conn: RawConn,
    cmd_sn: u32,
    itt: u32,
    params: SessionParams,
}

impl Client {
    async fn login(addr: std::net::SocketAddr, isid_last: u8) -> Client {
        let l = RawConn::login(
            addr,
            INITIATOR,
            TARGET,
            [0x80, 0, 0, 0, 7, isid_last],
            0,
            Digests::NONE,
            0x100,
            1,
        )
        .await;
        let mut c = Client {
            conn: l.conn,
            cmd_sn: 1,
            itt: 0x100,
            params: l.params,
        };
        // Consume the power-on unit attention.
        for _ in 0..3 {
            let cmd = c.command(&[0; 6], false, false, 0, true);
            c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
            if c.response(cmd.itt).await.0 == 0 {
                break;
            }
        }
        c
    }

    fn command(
        &mut self,
        cdb: &[u8],
        read: bool,
        write: bool,
        edtl: u32,
        final_bit: bool,
    ) -> ScsiCommand {
        self.itt += 1;
        let cmd = lun0_command(cdb, (read, write), edtl, final_bit, self.itt, self.cmd_sn);
        self.cmd_sn += 1;
        cmd
    }

    async fn recv(&mut self) -> Pdu {
        self.conn
            .recv_within(Duration::from_secs(10))
            .await
            .expect("a PDU from the target within 10 s")
    }

    /// Waits for the SCSI Response of `itt`: (status, sense data).
    async fn response(&mut self, itt: u32) -> (u8, Option<Sense>) {
        loop {
            let pdu = self.recv().await;
            match pdu.bhs {
                Bhs::ScsiResponse(r) if r.itt == itt => {
                    let sense =
                        (pdu.data.len() > 2).then(|| Sense::decode(&pdu.data[2..]).unwrap());
                    return (r.status, sense);
                }
                Bhs::NopIn(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Sends `data[start..end]` as Data-Out PDUs of at most the target's
    /// MaxRecvDataSegmentLength, DataSN from `sn`; F on the last one when
    /// `last`. Returns the next DataSN.
    async fn data_out(
        &mut self,
        cmd: &ScsiCommand,
        ttt: u32,
        data: &[u8],
        (start, end): (usize, usize),
        mut sn: u32,
        last: bool,
    ) -> u32 {
        let seg = self.params.target_max_recv_data_segment_length as usize;
        let mut o = start;
        while o < end {
            let e = (o + seg).min(end);
            let d = DataOut {
                final_bit: last && e == end,
                lun: cmd.lun,
                itt: cmd.itt,
                ttt,
                exp_stat_sn: 0,
                data_sn: sn,
                buffer_offset: o as u32,
            };
            self.conn
                .send(Pdu::with_data(Bhs::DataOut(d), data[o..e].to_vec()))
                .await;
            o = e;
            sn += 1;
        }
        sn
    }

    /// WRITE(10) of `data` at `lba` with immediate data, unsolicited and
    /// R2T-solicited Data-Out as negotiated; the R2Ts that arrive together
    /// (up to MaxOutstandingR2T) are answered after collecting them, in
    /// order. Returns the status and sense.
    async fn write(&mut self, lba: u32, data: &[u8]) -> (u8, Option<Sense>) {
        let p = self.params.clone();
        let seg = p.target_max_recv_data_segment_length as usize;
        let imm = data.len().min(p.first_burst_length as usize).min(seg);
        let unsolicited_end = if p.initial_r2t {
            imm
        } else {
            data.len().min(p.first_burst_length as usize)
        };
        let cmd = self.command(
            &rw10(0x2a, lba, (data.len() / 512) as u16),
            false,
            true,
            data.len() as u32,
            unsolicited_end == imm,
        );
        self.conn
            .send(Pdu::with_data(Bhs::ScsiCommand(cmd), data[..imm].to_vec()))
            .await;
        self.data_out(&cmd, RESERVED_TAG, data, (imm, unsolicited_end), 0, true)
            .await;
        let mut open: Vec<R2t> = Vec::new();
        loop {
            // Collect what is queued (several R2Ts come together).
            let pdu = match self.conn.recv_within(Duration::from_millis(20)).await {
                Some(p) => p,
                None if !open.is_empty() => {
                    for r in std::mem::take(&mut open) {
                        let range = (
                            r.buffer_offset as usize,
                            (r.buffer_offset + r.desired_data_transfer_length) as usize,
                        );
                        self.data_out(&cmd, r.ttt, data, range, 0, true).await;
                    }
                    continue;
                }
                None => self.recv().await,
            };
            match pdu.bhs {
                Bhs::R2t(r) => open.push(r),
                Bhs::ScsiResponse(r) if r.itt == cmd.itt => {
                    assert!(open.is_empty(), "status before the data was sent");
                    let sense =
                        (pdu.data.len() > 2).then(|| Sense::decode(&pdu.data[2..]).unwrap());
                    return (r.status, sense);
                }
                Bhs::NopIn(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// READ(10) through the normal path.
    async fn read(&mut self, lba: u32, len: usize) -> Vec<u8> {
        let cmd = self.command(
            &rw10(0x28, lba, (len / 512) as u16),
            true,
            false,
            len as u32,
            true,
        );
        self.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
        let mut out = vec![0u8; len];
        loop {
            let pdu = self.recv().await;
            match pdu.bhs {
                Bhs::DataIn(d) if d.itt == cmd.itt => {
                    let at = d.buffer_offset as usize;
                    out[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
                    if let Some(s) = d.status {
                        assert_eq!(s, 0);
                        return out;
                    }
                }
                Bhs::ScsiResponse(r) if r.itt == cmd.itt => {
                    assert_eq!(r.status, 0);
                    return out;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), different per `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// 64 MiB in WRITEs of mixed sizes (1 MiB, 4 MiB, one with a partial last
/// chunk), then read back through the fabric and from the file: equal.
async fn integrity(mode: FileMode) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("lun.img");
    let size: u64 = 80 << 20;
    let t = start(&img, size, mode, &img, engine(BufferPool::with_defaults())).await;
    let mut c = Client::login(t.addr, mode as u8).await;
    let total = 64usize << 20;
    let data = pattern(total, mode as u64 + 1);
    let sizes = [1usize << 20, 4 << 20, (1 << 20) + 3 * 4096];
    let (mut at, mut i, mut writes) = (0usize, 0usize, 0u64);
    while at < total {
        let n = sizes[i % sizes.len()].min(total - at);
        let (status, sense) = c.write((at / 512) as u32, &data[at..at + n]).await;
        assert_eq!(status, 0, "write at {at}: {sense:?}");
        at += n;
        i += 1;
        writes += 1;
    }
    // A WRITE of 3 blocks at an odd LBA: pipelined on a cached LUN (one
    // partial chunk), gathered on a direct one (not 4 KiB aligned).
    let odd = 5 * (1 << 20) + 512;
    let small = pattern(1536, 77);
    assert_eq!(c.write((odd / 512) as u32, &small).await.0, 0);
    let mut data = data;
    data[odd..odd + 1536].copy_from_slice(&small);
    writes += 1;
    let stats = &t.fabric.sync_writes.stats;
    let pipelined = stats.pipelined.load(Ordering::Relaxed);
    assert_eq!(
        pipelined + stats.gathered.load(Ordering::Relaxed),
        writes,
        "every WRITE counted once"
    );
    assert!(
        pipelined * 2 > writes,
        "only {pipelined} of {writes} WRITEs pipelined"
    );
    assert!(stats.chunks.load(Ordering::Relaxed) >= pipelined);
    for off in (0..total).step_by(4 << 20) {
        let back = c.read((off / 512) as u32, 4 << 20).await;
        assert!(
            back == data[off..off + (4 << 20)],
            "read back differs at {off}"
        );
    }
    let file = std::fs::read(&img).unwrap();
    assert!(file[..total] == data[..], "file content differs");
    assert!(
        file[total..].iter().all(|&b| b == 0),
        "bytes beyond the writes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_lun_writes_64_mib_and_reads_back_equal() {
    tokio::time::timeout(Duration::from_secs(120), integrity(FileMode::Cached))
        .await
        .expect("within 120 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_lun_writes_64_mib_and_reads_back_equal() {
    tokio::time::timeout(Duration::from_secs(120), integrity(FileMode::Direct))
        .await
        .expect("within 120 s");
}

/// Sends a 1 MiB WRITE with no immediate data and answers its first R2T
/// with only the first `first` bytes; returns the command and that R2T.
async fn half_sent_write(c: &mut Client, data: &[u8], first: usize) -> (ScsiCommand, R2t, u32) {
    let cmd = c.command(
        &rw10(0x2a, 0, (data.len() / 512) as u16),
        false,
        true,
        data.len() as u32,
        true,
    );
    c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    let r = loop {
        if let Bhs::R2t(r) = c.recv().await.bhs {
            if r.buffer_offset == 0 {
                break r;
            }
        }
    };
    let sn = c.data_out(&cmd, r.ttt, data, (0, first), 0, false).await;
    (cmd, r, sn)
}

/// LUN 0's WRITE statistics: commands, errors, bytes.
fn write_counts(t: &TestTarget) -> (u64, u64, u64) {
    let lu = t.fabric.catalog().targets[0].luns.get(0).unwrap();
    let w = lu.stats().direction(Direction::Write);
    let counted = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    (counted(&w.commands), counted(&w.errors), counted(&w.bytes))
}

/// Waits until `f` holds, at most 10 s.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_goes_to_disk_while_the_rest_is_still_arriving() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("lun.img");
    let t = start_cached(&img, &img).await;
    let mut c = Client::login(t.addr, 1).await;
    let data = pattern(256 << 10, 9);
    let (cmd, r, sn) = half_sent_write(&mut c, &data, CHUNK).await;
    let stats = &t.fabric.sync_writes.stats;
    // Chunk 0 complete: submitted although 3/4 of the data has not left
    // the initiator yet.
    until("chunk 0 submitted", || {
        stats.chunks.load(Ordering::Relaxed) >= 1
    })
    .await;
    assert_eq!(stats.chunks.load(Ordering::Relaxed), 1);
    assert_eq!(stats.overlapped.load(Ordering::Relaxed), 1);
    let end = (r.buffer_offset + r.desired_data_transfer_length) as usize;
    c.data_out(&cmd, r.ttt, &data, (CHUNK, end), sn, true).await;
    let mut status = None;
    while status.is_none() {
        let pdu = c.recv().await;
        match pdu.bhs {
            Bhs::R2t(r) => {
                let range = (
                    r.buffer_offset as usize,
                    (r.buffer_offset + r.desired_data_transfer_length) as usize,
                );
                c.data_out(&cmd, r.ttt, &data, range, 0, true).await;
            }
            Bhs::ScsiResponse(s) if s.itt == cmd.itt => status = Some(s.status),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(status, Some(0));
    assert_eq!(stats.chunks.load(Ordering::Relaxed), 4);
    assert!(stats.overlapped.load(Ordering::Relaxed) >= 1);
    assert_eq!(&std::fs::read(&img).unwrap()[..data.len()], &data[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_chunk_write_answers_the_cores_sense() {
    // The engine writes to /dev/full: every write fails with ENOSPC, which
    // the core answers DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT
    // with the LBA (a thin file that could not grow).
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("lun.img");
    let t = start_cached(&img, Path::new("/dev/full")).await;
    let mut c = Client::login(t.addr, 2).await;
    let data = pattern(512 << 10, 3);
    let (status, sense) = c.write(2048, &data).await;
    assert_eq!(status, 2, "CHECK CONDITION");
    let s = sense.expect("sense data");
    assert_eq!(s.key, SenseKey::DataProtect);
    let want = Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT;
    assert_eq!((s.asc, s.ascq), (want.asc, want.ascq));
    let lba = s.information.expect("the failed LBA");
    assert!(
        (2048..2048 + 1024).contains(&lba),
        "LBA {lba} outside the write"
    );
    assert_eq!(
        t.fabric.sync_writes.stats.pipelined.load(Ordering::Relaxed),
        1
    );
    // Counted once, as an error, with no byte written.
    assert_eq!(write_counts(&t), (1, 1, 0), "commands, errors, bytes");
    // The connection and the window go on.
    assert_eq!(c.read(0, 4096).await, vec![0u8; 4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_write_its_data_out_breaks_counts_its_r2ts_in_exp_data_sn() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("lun.img");
    let t = start_cached(&img, &img).await;
    let mut c = Client::login(t.addr, 3).await;
    let data = pattern(256 << 10, 4);
    let cmd = c.command(
        &rw10(0x2a, 0, (data.len() / 512) as u16),
        false,
        true,
        data.len() as u32,
        true,
    );
    c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    let mut r2ts = Vec::new();
    let first = loop {
        match c.recv().await.bhs {
            Bhs::R2t(r) => {
                r2ts.push(r);
                break r;
            }
            Bhs::NopIn(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    // DataSN 1 where 0 is due: the sequence is broken and the command fails.
    c.data_out(&cmd, first.ttt, &data, (0, 8192), 1, false)
        .await;
    let resp = loop {
        match c.recv().await.bhs {
            Bhs::R2t(r) => r2ts.push(r),
            Bhs::ScsiResponse(s) if s.itt == cmd.itt => break s,
            Bhs::NopIn(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(resp.status, 2, "CHECK CONDITION");
    assert_eq!(
        t.fabric.sync_writes.stats.pipelined.load(Ordering::Relaxed),
        1,
        "the pipelined path ran it"
    );
    // Counted once, as an error, with no byte written.
    until("the WRITE counted", || write_counts(&t).0 == 1).await;
    assert_eq!(write_counts(&t), (1, 1, 0), "commands, errors, bytes");
    // ExpDataSN counts the R2Ts sent for the command (RFC 7143 §11.4.8).
    assert_eq!(resp.exp_data_sn, r2ts.len() as u32, "{} R2Ts", r2ts.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_during_a_pipelined_write_sends_no_status_and_frees_everything() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("lun.img");
    // One 1 MiB buffer: had the aborted WRITE kept it, later WRITEs would
    // take the gathered path.
    let pool = BufferPool::new(&[(1 << 20, 1)]);
    let t = start(&img, 8 << 20, FileMode::Cached, &img, engine(pool)).await;
    let mut c = Client::login(t.addr, 3).await;
    let stats = &t.fabric.sync_writes.stats;
    let data = pattern(1 << 20, 5);
    let (cmd, r, sn) = half_sent_write(&mut c, &data, 2 * CHUNK).await;
    until("chunks submitted", || {
        stats.chunks.load(Ordering::Relaxed) >= 2
    })
    .await;
    c.itt += 1;
    let abort = TaskMgmtRequest {
        immediate: true,
        function: TmfFunction::AbortTask,
        lun: cmd.lun,
        itt: c.itt,
        referenced_task_tag: cmd.itt,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: 0,
        ref_cmd_sn: cmd.cmd_sn,
        exp_data_sn: 0,
    };
    c.conn.send(Pdu::new(Bhs::TaskMgmtRequest(abort))).await;
    loop {
        let pdu = c.recv().await;
        match pdu.bhs {
            Bhs::TaskMgmtResponse(m) => {
                assert_eq!(m.response, TmfResponse::FunctionComplete);
                break;
            }
            Bhs::R2t(_) => {}
            other => panic!("unexpected {other:?} before the TMF response"),
        }
    }
    // The rest of its data is ignored; no status follows for it.
    let end = (r.buffer_offset + r.desired_data_transfer_length) as usize;
    c.data_out(&cmd, r.ttt, &data, (2 * CHUNK, end), sn, true)
        .await;
    if let Some(pdu) = c.conn.recv_within(Duration::from_millis(300)).await {
        panic!("nothing expected after the abort, got {pdu:?}");
    }
    // Its buffer came back: three more WRITEs all take the pipelined path.
    let before = stats.gathered.load(Ordering::Relaxed);
    for i in 0..3u32 {
        let d = pattern(1 << 20, 10 + u64::from(i));
        assert_eq!(c.write(i * 2048, &d).await.0, 0);
        assert_eq!(c.read(i * 2048, 1 << 20).await, d);
    }
    assert_eq!(
        stats.gathered.load(Ordering::Relaxed),
        before,
        "a buffer leaked"
    );
    assert_eq!(stats.pipelined.load(Ordering::Relaxed), 4);
    // The aborted WRITE did not complete: it counts as an error without
    // its bytes, not as a good 1 MiB.
    assert_eq!(write_counts(&t), (4, 1, 3 << 20), "commands, errors, bytes");
}

/// An engine whose batches of WRITE ops wait until released before they
/// go to the real engine, so a pipelined WRITE's chunk writes stay in
/// flight as long as a test wants.
struct HeldWrites {
    inner: Arc<dyn Engine>,
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    /// WRITE ops submitted.
    held: std::sync::atomic::AtomicUsize,
}

impl HeldWrites {
    fn new(inner: Arc<dyn Engine>) -> Arc<HeldWrites> {
        Arc::new(HeldWrites {
            inner,
            gate: Arc::default(),
            held: Default::default(),
        })
    }

    fn release(&self) {
        *self.gate.0.lock().unwrap() = true;
        self.gate.1.notify_all();
    }
}

/// Releases the held writes when dropped, also when an assertion fails.
struct ReleaseOnDrop(Arc<HeldWrites>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Engine for HeldWrites {
    fn kind(&self) -> EngineKind {
        self.inner.kind()
    }
    fn describe(&self) -> String {
        format!("{} (writes held)", self.inner.describe())
    }
    fn pool(&self) -> &BufferPool {
        self.inner.pool()
    }
    fn submit(&self, ops: Vec<IoOp>, done: &CompletionTx) -> std::io::Result<()> {
        if ops.iter().all(|op| op.kind != OpKind::Write) {
            return self.inner.submit(ops, done);
        }
        self.held.fetch_add(ops.len(), Ordering::SeqCst);
        let (inner, gate, done) = (self.inner.clone(), self.gate.clone(), done.clone());
        std::thread::spawn(move || {
            let mut released = gate.0.lock().unwrap();
            while !*released {
                released = gate.1.wait(released).unwrap();
            }
            drop(released);
            let tags: Vec<u64> = ops.iter().map(|op| op.tag).collect();
            if let Err(e) = inner.submit(ops, &done) {
                // Every op completes exactly once (the engine's contract).
                for tag in tags {
                    let result = Err(std::io::Error::new(e.kind(), e.to_string()));
                    let _ = done.send(Completion { tag, result });
                }
            }
        });
        Ok(())
    }
}

/// CLEAR TASK SET from another initiator clears a pipelined WRITE (one
/// task set per unit, SAM-5 7.4) and is answered only once that WRITE's
/// chunk writes ended: none of its data may reach the medium after
/// "Function complete". The other session cannot see this connection's
/// table of running pipelined WRITEs; it was answered while the chunks
/// were still being written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_task_set_from_another_initiator_waits_for_a_pipelined_writes_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("lun.img");
    let held = HeldWrites::new(engine(BufferPool::new(&[(1 << 20, 1)])));
    let t = start(&img, 8 << 20, FileMode::Cached, &img, held.clone()).await;
    let _release = ReleaseOnDrop(held.clone());
    let mut a = Client::login(t.addr, 3).await;
    let mut b = Client::login(t.addr, 4).await;
    let data = pattern(1 << 20, 5);
    let (cmd, _, _) = half_sent_write(&mut b, &data, 2 * CHUNK).await;
    until("chunk writes submitted", || {
        held.held.load(Ordering::SeqCst) >= 1
    })
    .await;
    a.itt += 1;
    let clear = TaskMgmtRequest {
        immediate: true,
        function: TmfFunction::ClearTaskSet,
        lun: cmd.lun,
        itt: a.itt,
        referenced_task_tag: RESERVED_TAG,
        cmd_sn: a.cmd_sn,
        exp_stat_sn: 0,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    };
    a.conn.send(Pdu::new(Bhs::TaskMgmtRequest(clear))).await;
    if let Some(pdu) = a.conn.recv_within(Duration::from_millis(500)).await {
        panic!("answered while the cleared WRITE's chunks were being written: {pdu:?}");
    }
    held.release();
    match a.recv().await.bhs {
        Bhs::TaskMgmtResponse(m) => assert_eq!(m.response, TmfResponse::FunctionComplete),
        other => panic!("expected the TMF response, got {other:?}"),
    }
    // B hears nothing of its WRITE, and of the clear by a unit attention,
    // COMMANDS CLEARED BY ANOTHER INITIATOR.
    let tur = b.command(&[0; 6], false, false, 0, true);
    b.conn.send(Pdu::new(Bhs::ScsiCommand(tur))).await;
    let sense = loop {
        let pdu = b.recv().await;
        match pdu.bhs {
            Bhs::ScsiResponse(r) if r.itt == cmd.itt => panic!("the cleared WRITE was answered"),
            Bhs::ScsiResponse(r) if r.itt == tur.itt => {
                assert_eq!(r.status, 2, "CHECK CONDITION with the unit attention");
                break Sense::decode(&pdu.data[2..]).unwrap();
            }
            Bhs::R2t(_) | Bhs::NopIn(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(sense.key, SenseKey::UnitAttention);
    assert_eq!((sense.asc, sense.ascq), (0x2f, 0x00));
}
