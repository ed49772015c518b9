//! READ send paths over real sockets: sendfile from the
//! page cache, the copy path, the engine path, zero-copy sends and
//! `--no-net`; each proven by the data read back and by the debug copy
//! counter's deltas (crate::copies). One target per scenario, on
//! 127.0.0.1:0, with a cached file LUN on a temporary file.
//!
//! The counters are process-wide: nextest runs each test in its own
//! process, and every scenario here runs inside one test function.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use blockwire_pdu::pdu::codes::{TaskAttr, TmfFunction, TmfResponse};
use blockwire_pdu::pdu::{ScsiCommand, TaskMgmtRequest};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu};
use blockwire_target::backstore::{lives_in_memory, FileBackstore, FileMode};
use blockwire_target::copies::{totals, CopyPath, Counts};
use blockwire_target::datapath::{Mode, Phase};
use blockwire_target::iscsi::catalog::Acl;
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{LogicalUnit, LuConfig};

mod support;
use support::{bind_target, RawConn, TestTarget};

const TARGET: &str = "iqn.2026-11.io.blockwire:send-paths";
const INITIATOR: &str = "iqn.2026-11.io.blockwire:send-paths-initiator";
const MIB: usize = 1 << 20;

/// How the test LUN serves READs.
#[derive(Debug, Clone, Copy)]
enum Lun0 {
    /// Not registered anywhere: the SCSI core reads (copy path).
    Serial,
    /// sendfile registry, `sendfile(2)` even to this host's initiators.
    Sendfile,
    /// sendfile registry with the file in tmpfs (/dev/shm) and copying
    /// sends from its mapping to initiators on this host (the default).
    Mapped,
    /// As `Mapped`, with the file on a device's file system (cached, since
    /// it was just written).
    MappedOnDisk,
    /// Engine path (serial mode), O_DIRECT or buffered.
    Engine { direct: bool },
    /// Engine path with synchronized sends (16 KiB chunks), O_DIRECT or
    /// buffered.
    EngineSync { direct: bool },
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 512) as u8) ^ (i as u8).wrapping_mul(7))
        .collect()
}

/// A target whose LUN 0 is a cached file LUN of `size` bytes of
/// [`pattern`], served as `lun0` says; the file lives in the returned
/// directory.
async fn start(
    size: usize,
    lun0: Lun0,
    settings: FabricSettings,
) -> (TestTarget, tempfile::TempDir) {
    let dir = match lun0 {
        Lun0::Mapped => tempfile::Builder::new()
            .prefix("bw-send-paths")
            .tempdir_in("/dev/shm")
            .expect("a tmpfs at /dev/shm for the mapped send path"),
        Lun0::MappedOnDisk => {
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
            assert!(
                !lives_in_memory(std::fs::File::open(dir.path()).unwrap()),
                "{:?} is in tmpfs: the on-disk mapped send path needs a device's file system there",
                dir.path()
            );
            dir
        }
        _ => tempfile::tempdir().unwrap(),
    };
    let path = dir.path().join("lun0.img");
    std::fs::write(&path, pattern(size)).unwrap();
    let store =
        FileBackstore::open_with(&path, Some(size as u64), false, FileMode::Cached).unwrap();
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(store)));
    let t = bind_target(TARGET, Acl::Any, lu, settings).await;
    let engine = |direct, chunk, mode| {
        t.fabric
            .sync_reads
            .enable(TARGET, 0, &path, direct, chunk, mode)
            .unwrap();
    };
    match lun0 {
        Lun0::Serial => {}
        Lun0::Sendfile | Lun0::Mapped | Lun0::MappedOnDisk => {
            t.fabric.sendfile_reads.enable(TARGET, 0, &path).unwrap();
        }
        Lun0::Engine { direct } => engine(direct, 64 << 10, Mode::Serial),
        Lun0::EngineSync { direct } => engine(direct, 16 << 10, Mode::Synchronized),
    }
    (t.serve(), dir)
}

fn settings(zero_copy_send: bool, no_net: bool) -> FabricSettings {
    FabricSettings {
        zero_copy_send,
        no_net,
        nop_interval: None,
        ..FabricSettings::default()
    }
}

struct Client {
    conn: RawConn,
    itt: u32,
    cmd_sn: u32,
}

impl Client {
    async fn login(addr: std::net::SocketAddr, digests: Digests) -> Client {
        let l = RawConn::login(
            addr,
            INITIATOR,
            TARGET,
            [0x80, 0, 0, 0, 0, 9],
            0,
            digests,
            1,
            1,
        )
        .await;
        let mut c = Client {
            conn: l.conn,
            itt: 1,
            cmd_sn: 1,
        };
        // The first command of a new nexus gets the POWER ON unit
        // attention: take it with TEST UNIT READY.
        c.itt += 1;
        let tur = ScsiCommand {
            immediate: false,
            final_bit: true,
            read: false,
            write: false,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(0),
            itt: c.itt,
            expected_data_transfer_length: 0,
            cmd_sn: c.cmd_sn,
            exp_stat_sn: 0,
            cdb: [0; 16],
        };
        c.cmd_sn += 1;
        c.conn.send(Pdu::new(Bhs::ScsiCommand(tur))).await;
        loop {
            let p = c.conn.recv_within(Duration::from_secs(5)).await.unwrap();
            if matches!(p.bhs, Bhs::ScsiResponse(r) if r.itt == tur.itt) {
                break;
            }
        }
        c
    }

    /// Sends a READ(10) of `len` bytes at byte `at`; returns its ITT.
    async fn send_read(&mut self, at: usize, len: usize) -> u32 {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x28;
        cdb[2..6].copy_from_slice(&((at / 512) as u32).to_be_bytes());
        cdb[7..9].copy_from_slice(&((len / 512) as u16).to_be_bytes());
        self.itt += 1;
        let cmd = ScsiCommand {
            immediate: false,
            final_bit: true,
            read: true,
            write: false,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(0),
            itt: self.itt,
            expected_data_transfer_length: len as u32,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb,
        };
        self.cmd_sn += 1;
        self.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
        self.itt
    }

    /// Reads `len` bytes at `at`: (status, data, residual underflow count,
    /// Data-In PDUs received).
    async fn read(&mut self, at: usize, len: usize) -> (u8, Vec<u8>, Option<u32>, usize) {
        let itt = self.send_read(at, len).await;
        let mut data = vec![0u8; len];
        let mut pdus = 0;
        loop {
            let pdu = self
                .conn
                .recv_within(Duration::from_secs(20))
                .await
                .expect("READ response within 20 s");
            match pdu.bhs {
                Bhs::DataIn(d) if d.itt == itt => {
                    pdus += 1;
                    let o = d.buffer_offset as usize;
                    data[o..o + pdu.data.len()].copy_from_slice(&pdu.data);
                    if let Some(s) = d.status {
                        return (s, data, d.underflow.then_some(d.residual_count), pdus);
                    }
                }
                Bhs::ScsiResponse(r) if r.itt == itt => {
                    return (
                        r.status,
                        data,
                        r.underflow.then_some(r.residual_count),
                        pdus,
                    );
                }
                Bhs::NopIn(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

/// Waits (at most 10 s) until `path` counted `commands` more commands than
/// `before` and every zero-copy send was notified; returns the delta.
async fn delta(path: CopyPath, before: &Counts, commands: u64) -> Counts {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = totals(path).since(before);
        if d.commands >= commands && d.zc_copied + d.zc_zero >= d.zc_sent {
            return d;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path:?} counters did not settle: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads 1 MiB at 1 MiB through a fresh target and returns the delta of
/// `path`'s counters, after checking the data.
async fn read_one_mib(lun0: Lun0, zc: bool, digests: Digests, path: CopyPath) -> Counts {
    let mut s = settings(zc, false);
    s.local_copy_sends = matches!(lun0, Lun0::Mapped | Lun0::MappedOnDisk);
    read_one_mib_with(lun0, s, digests, path, |_| {}).await
}

/// [`read_one_mib`] with the fabric's settings given.
async fn read_one_mib_with(
    lun0: Lun0,
    settings: FabricSettings,
    digests: Digests,
    path: CopyPath,
    before_login: fn(&std::path::Path),
) -> Counts {
    let (t, dir) = start(4 * MIB, lun0, settings).await;
    before_login(&dir.path().join("lun0.img"));
    let mut c = Client::login(t.addr, digests).await;
    let before = totals(path);
    let (status, data, residual, _) = c.read(MIB, MIB).await;
    assert_eq!(status, 0, "{lun0:?}");
    assert_eq!(residual, None);
    assert!(
        data == pattern(2 * MIB)[MIB..],
        "{lun0:?}: data read back differ from the file"
    );
    delta(path, &before, 1).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_counts_per_path() {
    let plain = Digests::NONE;
    let m = MIB as u64;

    // sendfile: no byte passes through user space.
    let d = read_one_mib(Lun0::Sendfile, false, plain, CopyPath::Sendfile).await;
    println!("sendfile: {d:?}");
    assert_eq!((d.commands, d.payload, d.sendfile), (1, m, m));
    assert_eq!(d.copies(), 0, "sendfile path copies nothing: {d:?}");

    // An in-memory file to an initiator on this host: one copying send
    // from the file's mapping, no sendfile.
    let d = read_one_mib(Lun0::Mapped, false, plain, CopyPath::Sendfile).await;
    println!("mapped: {d:?}");
    assert_eq!((d.commands, d.payload, d.sendfile), (1, m, 0), "{d:?}");
    assert_eq!(
        (d.user_copied, d.read_to_user, d.sent_from_user),
        (0, 0, m),
        "{d:?}"
    );
    assert_eq!(d.copies_per_byte(), 1.0);

    // The same from a file on a device whose pages are cached.
    let d = read_one_mib(Lun0::MappedOnDisk, false, plain, CopyPath::Sendfile).await;
    println!("mapped on disk: {d:?}");
    assert_eq!((d.commands, d.payload, d.sendfile), (1, m, 0), "{d:?}");
    assert_eq!(d.sent_from_user, m, "{d:?}");

    // Its pages dropped from the page cache: the first payload goes by
    // sendfile, which may wait for the device, rather than by a fault in
    // the middle of a copying send; the read-ahead that sendfile starts
    // may leave later payloads cached, and those go from the mapping.
    let mut s = settings(false, false);
    s.local_copy_sends = true;
    let evict = |path: &std::path::Path| {
        let f = std::fs::File::open(path).unwrap();
        f.sync_all().unwrap();
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    };
    let d = read_one_mib_with(Lun0::MappedOnDisk, s, plain, CopyPath::Sendfile, evict).await;
    println!("uncached on disk: {d:?}");
    assert!(d.sendfile > 0, "{d:?}");
    assert_eq!(d.sendfile + d.sent_from_user, m, "{d:?}");

    // sendfile with header digests: still sendfile.
    let hd = Digests {
        header: true,
        data: false,
    };
    let d = read_one_mib(Lun0::Sendfile, false, hd, CopyPath::Sendfile).await;
    assert_eq!((d.sendfile, d.copies()), (m, 0), "{d:?}");

    // DataDigest on: the same road, the connection's writer reading each
    // payload into memory to digest it: no sendfile, one read into memory
    // and one send from it, and nothing through the SCSI core's copy path.
    let dd = Digests {
        header: false,
        data: true,
    };
    let copy_before = totals(CopyPath::Copy);
    let d = read_one_mib(Lun0::Sendfile, false, dd, CopyPath::Sendfile).await;
    assert_eq!(totals(CopyPath::Copy).since(&copy_before).commands, 0);
    assert_eq!(
        (d.sendfile, d.read_to_user, d.sent_from_user),
        (0, m, m),
        "{d:?}"
    );

    // Copy path, plain sends: pread into a buffer (1 kernel copy), writev
    // of 64 KiB payloads from it (1 kernel copy), no memcpy of ours.
    let d = read_one_mib(Lun0::Serial, false, plain, CopyPath::Copy).await;
    println!("copy: {d:?}");
    assert_eq!((d.commands, d.payload), (1, m));
    assert_eq!(
        (d.user_copied, d.read_to_user, d.sent_from_user, d.zc_sent),
        (0, m, m, 0),
        "{d:?}"
    );
    assert_eq!(d.copies_per_byte(), 2.0);

    // Copy path with zero-copy sends: the send side no longer copies in
    // user context; on loopback the kernel reports it copied anyway.
    let d = read_one_mib(Lun0::Serial, true, plain, CopyPath::Copy).await;
    println!("copy + MSG_ZEROCOPY: {d:?}");
    assert_eq!(
        (d.read_to_user, d.sent_from_user, d.zc_sent),
        (m, 0, m),
        "{d:?}"
    );
    assert_eq!(d.zc_copied + d.zc_zero, m, "every zero-copy send notified");

    // The same with copying sends to initiators on this host (the
    // default): no MSG_ZEROCOPY, which loopback delivery copies anyway.
    let mut local = settings(true, false);
    local.local_copy_sends = true;
    let d = read_one_mib_with(Lun0::Serial, local, plain, CopyPath::Copy, |_| {}).await;
    println!("copy, initiator on this host: {d:?}");
    assert_eq!(
        (d.read_to_user, d.sent_from_user, d.zc_sent),
        (m, m, 0),
        "{d:?}"
    );

    // Engine path, O_DIRECT (ext4 here): DMA into registered buffers.
    let d = read_one_mib(
        Lun0::Engine { direct: true },
        false,
        plain,
        CopyPath::Engine,
    )
    .await;
    println!("engine O_DIRECT: {d:?}");
    assert_eq!((d.commands, d.payload), (1, m));
    assert_eq!(
        (d.user_copied, d.read_to_user, d.sent_from_user),
        (0, 0, m),
        "{d:?}"
    );
    let d = read_one_mib(Lun0::Engine { direct: true }, true, plain, CopyPath::Engine).await;
    println!("engine O_DIRECT + MSG_ZEROCOPY: {d:?}");
    assert_eq!(
        (d.user_copied, d.read_to_user, d.sent_from_user, d.zc_sent),
        (0, 0, 0, m),
        "{d:?}"
    );

    // Engine path, buffered: one kernel copy into the registered buffer.
    let d = read_one_mib(
        Lun0::Engine { direct: false },
        false,
        plain,
        CopyPath::Engine,
    )
    .await;
    assert_eq!(
        (d.user_copied, d.read_to_user, d.sent_from_user),
        (0, m, m),
        "{d:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_net_reads_but_sends_nothing() {
    let (t, _dir) = start(4 * MIB, Lun0::Sendfile, settings(true, true)).await;
    let mut c = Client::login(t.addr, Digests::NONE).await;
    let before = totals(CopyPath::NoNet);
    let (status, data, residual, pdus) = c.read(0, MIB).await;
    assert_eq!(status, 0, "GOOD");
    assert_eq!(pdus, 0, "no Data-In");
    assert_eq!(residual, Some(MIB as u32), "underflow of the whole length");
    assert!(data.iter().all(|&b| b == 0));
    let d = delta(CopyPath::NoNet, &before, 1).await;
    assert_eq!(d.payload, MIB as u64, "the data were read: {d:?}");
    assert_eq!(d.read_to_user, MIB as u64, "through the page cache");
    // Other commands still carry data: INQUIRY.
    let mut cdb = [0u8; 16];
    cdb[0] = 0x12;
    cdb[4] = 96;
    c.itt += 1;
    let cmd = ScsiCommand {
        immediate: false,
        final_bit: true,
        read: true,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: c.itt,
        expected_data_transfer_length: 96,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: 0,
        cdb,
    };
    c.cmd_sn += 1;
    c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    let pdu = c.conn.recv_within(Duration::from_secs(5)).await.unwrap();
    assert!(
        matches!(pdu.bhs, Bhs::DataIn(_)) && pdu.data.len() >= 36,
        "INQUIRY data still sent: {pdu:?}"
    );
}

/// `--no-net` on engine-path LUNs: the READ goes through the engine as
/// configured (its state timers land in the LUN's histograms, its bytes in
/// the no-net copy counter), sends no Data-In and ends GOOD with an
/// underflow of the whole length; the engine counter is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_net_engine_path_reads_through_the_engine() {
    for lun0 in [
        Lun0::EngineSync { direct: true },
        Lun0::Engine { direct: true },
        Lun0::EngineSync { direct: false },
    ] {
        let (t, _dir) = start(4 * MIB, lun0, settings(false, true)).await;
        let mut c = Client::login(t.addr, Digests::NONE).await;
        let stats = t.fabric.sync_reads.stats();
        assert_eq!(stats.len(), 1, "{lun0:?}: one engine-path LUN");
        let hist = stats[0].2.clone();
        let reads = |h: &blockwire_target::datapath::PhaseStats| h.histogram(Phase::Total).count();
        let (reads_before, bytes_before) = (reads(&hist), hist.bytes.load(Ordering::Relaxed));
        let nonet_before = totals(CopyPath::NoNet);
        let engine_before = totals(CopyPath::Engine);
        let (status, data, residual, pdus) = c.read(MIB, 2 * MIB).await;
        assert_eq!(status, 0, "{lun0:?}: GOOD");
        assert_eq!(pdus, 0, "{lun0:?}: no Data-In");
        assert_eq!(
            residual,
            Some(2 * MIB as u32),
            "{lun0:?}: underflow of the whole length"
        );
        assert!(data.iter().all(|&b| b == 0));
        assert_eq!(
            reads(&hist) - reads_before,
            1,
            "{lun0:?}: the engine read it (one READ in the LUN's histogram)"
        );
        assert_eq!(
            hist.bytes.load(Ordering::Relaxed) - bytes_before,
            2 * MIB as u64,
            "{lun0:?}: bytes read by the engine"
        );
        assert!(
            hist.histogram(Phase::DiskRead).count() > 0,
            "{lun0:?}: disk phase timed"
        );
        let d = delta(CopyPath::NoNet, &nonet_before, 1).await;
        let direct = matches!(
            lun0,
            Lun0::Engine { direct: true } | Lun0::EngineSync { direct: true }
        );
        assert_eq!((d.commands, d.payload), (1, 2 * MIB as u64), "{d:?}");
        assert_eq!(
            (d.user_copied, d.sent_from_user, d.zc_sent, d.sendfile),
            (0, 0, 0, 0),
            "{lun0:?}: nothing sent: {d:?}"
        );
        assert_eq!(
            d.read_to_user,
            if direct { 0 } else { 2 * MIB as u64 },
            "{lun0:?}: O_DIRECT reads are DMA, buffered ones a kernel copy: {d:?}"
        );
        assert_eq!(
            totals(CopyPath::Engine).since(&engine_before).commands,
            0,
            "{lun0:?}: not counted as sent by the engine path"
        );
        // A non-media READ on the same LUN still carries its data.
        let mut cdb = [0u8; 16];
        cdb[0] = 0x25; // READ CAPACITY(10)
        c.itt += 1;
        let cmd = ScsiCommand {
            immediate: false,
            final_bit: true,
            read: true,
            write: false,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(0),
            itt: c.itt,
            expected_data_transfer_length: 8,
            cmd_sn: c.cmd_sn,
            exp_stat_sn: 0,
            cdb,
        };
        c.cmd_sn += 1;
        c.conn.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
        let pdu = c.conn.recv_within(Duration::from_secs(5)).await.unwrap();
        assert!(
            matches!(pdu.bhs, Bhs::DataIn(_))
                && pdu.data[..4] == ((4 * MIB / 512 - 1) as u32).to_be_bytes(),
            "{lun0:?}: READ CAPACITY data still sent: {pdu:?}"
        );
    }
}

/// Many large sendfile READs queued while the initiator does not read (so
/// their Data-In PDUs interleave in the connection's queue and the jobs
/// block on it), then ABORT TASK SET: nothing of an aborted READ follows
/// the task management response and it gets no status; READs that
/// completed before it carry the right data; the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_during_sendfile_reads() {
    const READS: usize = 16;
    const LEN: usize = 8 * MIB;
    let (t, _dir) = start(LEN, Lun0::Sendfile, settings(false, false)).await;
    let mut c = Client::login(t.addr, Digests::NONE).await;
    let mut itts = Vec::new();
    for _ in 0..READS {
        itts.push(c.send_read(0, LEN).await);
    }
    // Let the writer fill the socket and the jobs fill the queue.
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.itt += 1;
    let tmf_itt = c.itt;
    c.conn
        .send(Pdu::new(Bhs::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::AbortTaskSet,
            lun: Lun::from_index(0),
            itt: tmf_itt,
            referenced_task_tag: u32::MAX,
            cmd_sn: c.cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn: 0,
            exp_data_sn: 0,
        })))
        .await;
    let want = pattern(LEN);
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; LEN]; READS];
    let mut done = [false; READS];
    let mut pdus = [0usize; READS];
    let mut tmf: Option<TmfResponse> = None;
    let mut after_tmf = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tmf.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no TMF response");
        let pdu = c
            .conn
            .recv_within(Duration::from_secs(20))
            .await
            .expect("target keeps answering");
        match pdu.bhs {
            Bhs::DataIn(d) => {
                let i = itts.iter().position(|&x| x == d.itt).expect("known ITT");
                pdus[i] += 1;
                let o = d.buffer_offset as usize;
                bufs[i][o..o + pdu.data.len()].copy_from_slice(&pdu.data);
                if let Some(s) = d.status {
                    assert_eq!(s, 0);
                    done[i] = true;
                }
            }
            Bhs::TaskMgmtResponse(r) if r.itt == tmf_itt => tmf = Some(r.response),
            Bhs::NopIn(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(tmf, Some(TmfResponse::FunctionComplete));
    // Whatever comes now must not belong to the READs (nothing should
    // come at all: the TMF response follows everything queued before it).
    while let Some(p) = c.conn.recv_within(Duration::from_millis(500)).await {
        if matches!(p.bhs, Bhs::DataIn(d) if itts.contains(&d.itt)) {
            after_tmf += 1;
        }
    }
    assert_eq!(
        after_tmf, 0,
        "nothing of an aborted READ after the TMF response"
    );
    let completed = done.iter().filter(|d| **d).count();
    let partial = (0..READS).filter(|&i| !done[i] && pdus[i] > 0).count();
    println!(
        "abort: {completed} READs completed, {partial} aborted mid-transfer, {} never started",
        READS - completed - partial
    );
    assert!(
        completed < READS,
        "the queue cannot hold every READ: some were aborted"
    );
    assert!(
        partial >= 1,
        "some READ was aborted while being sent: {pdus:?}"
    );
    for i in 0..READS {
        if done[i] {
            assert!(bufs[i] == want, "READ {i} data differ");
        }
    }
    // The connection still works.
    let (status, data, _, _) = c.read(0, MIB).await;
    assert_eq!(status, 0);
    assert!(data == want[..MIB]);
}

/// With `busy_poll` set, a connection that handled what arrived keeps
/// looking at its socket before it sleeps. READs one at a time (each
/// answer is awaited, so every wait of the target ends in the poll) and a
/// window of them queued together come back whole on the serial and the
/// sendfile paths, and a closed initiator still ends the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_with_busy_polling() {
    for lun0 in [Lun0::Serial, Lun0::Sendfile] {
        let mut s = settings(true, false);
        s.busy_poll = Some(Duration::from_micros(200));
        let (t, _dir) = start(4 * MIB, lun0, s).await;
        let want = pattern(4 * MIB);
        let mut c = Client::login(t.addr, Digests::NONE).await;
        for (i, len) in [512, 4096, 65536, MIB].into_iter().enumerate() {
            let at = i * MIB;
            let (status, data, residual, _) = c.read(at, len).await;
            assert_eq!((status, residual), (0, None), "{lun0:?} READ of {len}");
            assert!(
                data == want[at..at + len],
                "{lun0:?}: READ of {len} differs"
            );
        }
        // 16 READs of 4 KiB queued at once, answered in any order.
        let mut itts = Vec::new();
        for i in 0..16 {
            itts.push(c.send_read(i * 8192, 4096).await);
        }
        let mut done = 0;
        while done < itts.len() {
            let pdu = c
                .conn
                .recv_within(Duration::from_secs(20))
                .await
                .expect("READ response within 20 s");
            if let Bhs::DataIn(d) = pdu.bhs {
                let i = itts.iter().position(|&x| x == d.itt).expect("known ITT");
                let at = i * 8192 + d.buffer_offset as usize;
                assert!(
                    pdu.data[..] == want[at..at + pdu.data.len()],
                    "{lun0:?}: READ {i} differs"
                );
                if d.status.is_some() {
                    done += 1;
                }
            }
        }
        drop(c);
        // The target sees the close: its session goes away.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !t.fabric.sessions.all().is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{lun0:?}: the session outlived its closed connection"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// READ commands LUN 0 of `t` counted in its statistics so far.
fn reads_counted(t: &TestTarget) -> u64 {
    let lu = t.fabric.catalog().targets[0].luns.get(0).unwrap();
    let n = lu
        .stats()
        .direction(blockwire_target::scsi::stats::Direction::Read)
        .commands
        .load(Ordering::Relaxed);
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_a_road_hands_back_to_the_core_is_counted_once() {
    // An O_DIRECT engine path cannot read 512 bytes at an odd block: the
    // road gives the planned READ back and the core answers it whole.
    let (t, _dir) = start(
        4 * MIB,
        Lun0::Engine { direct: true },
        settings(true, false),
    )
    .await;
    let mut c = Client::login(t.addr, Digests::default()).await;
    let (status, data, _, _) = c.read(512, 512).await;
    assert_eq!(status, 0);
    assert_eq!(data, pattern(1024)[512..]);
    assert_eq!(reads_counted(&t), 1, "one READ, counted once");
    let (status, data, _, _) = c.read(MIB, 64 << 10).await;
    assert_eq!(status, 0);
    assert_eq!(data, pattern(MIB + (64 << 10))[MIB..]);
    assert_eq!(reads_counted(&t), 2, "the engine's READ, counted once too");
    let _ = t.stop.send(true);
}

/// An engine READ that fails before any of its data went out falls back to
/// the core, which answers it and counts it: the plan gives up its own
/// count. Before, the READ was counted twice, once GOOD with all its bytes
/// by the plan. (The engine reads a directory here: every read fails with
/// EISDIR, while the core reads the LUN's file.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_engine_read_the_core_answers_is_counted_once() {
    let (t, dir) = start(4 * MIB, Lun0::Serial, settings(false, false)).await;
    t.fabric
        .sync_reads
        .enable(TARGET, 0, dir.path(), false, 64 << 10, Mode::Serial)
        .unwrap();
    let mut c = Client::login(t.addr, Digests::default()).await;
    let (status, data, _, _) = c.read(MIB, 64 << 10).await;
    assert_eq!(status, 0);
    assert_eq!(data, pattern(MIB + (64 << 10))[MIB..]);
    assert_eq!(reads_counted(&t), 1, "one READ, counted once");
    let _ = t.stop.send(true);
}

/// READs a road gives back to the core are read whole into memory, as on
/// the core's own road, so they take their share of the connection's READ
/// budget as those do: an initiator that does not take its data holds back
/// its own later READs instead of filling the target's memory. Here an
/// O_DIRECT engine path gives back 4 MiB READs at an odd block; without
/// the budget 60 of them would hold 240 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_a_road_hands_to_the_core_stay_within_the_read_budget() {
    let budget = FabricSettings {
        read_budget_bytes: 16 << 20,
        ..settings(false, false)
    };
    let (t, _dir) = start(8 * MIB, Lun0::Engine { direct: true }, budget).await;
    let mut c = Client::login(t.addr, Digests::default()).await;
    let base = support::resident_bytes();
    let mut itts = Vec::new();
    for _ in 0..60 {
        itts.push(c.send_read(512, 4 * MIB).await);
    }
    let growth = support::resident_growth_since(base).await;
    assert!(
        growth < 128 * MIB,
        "resident memory grew by {} MiB while the initiator left READ data unread",
        growth / MIB
    );
    let want = &pattern(512 + 4 * MIB)[512..];
    let mut back: std::collections::HashMap<u32, Vec<u8>> =
        itts.iter().map(|&i| (i, vec![0u8; 4 * MIB])).collect();
    let mut ended = 0;
    while ended < itts.len() {
        let pdu = c
            .conn
            .recv_within(Duration::from_secs(20))
            .await
            .expect("the READs' data and status");
        match pdu.bhs {
            Bhs::DataIn(d) => {
                let buf = back.get_mut(&d.itt).expect("a READ's task tag");
                let at = d.buffer_offset as usize;
                buf[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
                if let Some(status) = d.status {
                    assert_eq!(status, 0, "READ {:#x}", d.itt);
                    ended += 1;
                }
            }
            Bhs::ScsiResponse(r) => panic!("READ {:#x} ended {:#x} without data", r.itt, r.status),
            Bhs::NopIn(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    for (itt, got) in back {
        assert!(got == want, "READ {itt:#x} returned other data");
    }
    let _ = t.stop.send(true);
}

/// An initiator that sends READs and then takes none of their data is cut
/// once a send has waited the NOP timeout for room in the socket, on every
/// way READ data leave (pings off, so nothing else would notice): by
/// `sendfile(2)`, by copying sends from the file's mapping, and by
/// zero-copy sends of data the SCSI core read. A READ taken first shows
/// the path the connection's READs take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiator_that_stops_reading_is_cut_on_every_send_path() {
    let m = MIB as u64;
    for (lun0, zero_copy_send, path) in [
        (Lun0::Sendfile, false, CopyPath::Sendfile),
        (Lun0::Mapped, false, CopyPath::Sendfile),
        (Lun0::Serial, true, CopyPath::Copy),
    ] {
        let settings = FabricSettings {
            nop_timeout: Duration::from_secs(1),
            local_copy_sends: matches!(lun0, Lun0::Mapped),
            ..settings(zero_copy_send, false)
        };
        let (t, _dir) = start(16 * MIB, lun0, settings).await;
        let mut c = Client::login(t.addr, Digests::NONE).await;
        let before = totals(path);
        let (status, data, _, _) = c.read(MIB, MIB).await;
        assert_eq!(status, 0, "{lun0:?}");
        assert!(data == pattern(2 * MIB)[MIB..], "{lun0:?}: data differ");
        let d = delta(path, &before, 1).await;
        let went = match lun0 {
            Lun0::Sendfile => (d.sendfile, d.sent_from_user) == (m, 0),
            Lun0::Mapped => (d.sendfile, d.sent_from_user) == (0, m),
            _ => d.zc_sent > 0,
        };
        assert!(went, "{lun0:?}: the READ went another way: {d:?}");
        // 128 MiB of READs: far more than the socket buffers hold.
        for i in 0..32 {
            c.send_read((i % 4) * 4 * MIB, 4 * MIB).await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !t.fabric.sessions.all().is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{lun0:?}: an initiator taking nothing still has its session ({} bytes of READ data held)",
                t.fabric.read_data_held()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(c);
        let _ = t.stop.send(true);
    }
}
