//! blockwire's iSER target against an initiator that sends commands it never lets the
//! target answer: each advertises a read buffer in its iSER header (RFC 7145 §5.1), and
//! each carries a CmdSN outside the command window, so the target drops it unanswered
//! (RFC 7143 §4.2.2.1). A target that kept every advertised buffer until its command was
//! answered would hold one entry per such command for the connection's life; blockwire's
//! keeps at most twice the queue depth plus 128 (`iscsi::iser::buffers`), and the
//! connection still serves afterwards.
//!
//! The initiator here is written by hand on the soft RDMA provider's verbs (it is not
//! blockwire's initiator, which only sends commands inside the window).

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use blockwire_pdu::iser::{IserHeader, RemoteBuffer, ISER_HEADER_LEN};
use blockwire_pdu::keys::{encode_text, parse_text};
use blockwire_pdu::pdu::codes::TaskAttr;
use blockwire_pdu::pdu::{LoginRequest, NopOut, ScsiCommand, RESERVED_TAG};
use blockwire_pdu::{Bhs, Digests, LoginStatus, Lun, Pdu, Stage};
use blockwire_target::backstore::RamBackstore;
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use blockwire_transport::rdma::soft::{SoftCq, SoftMr, SoftProvider, SoftQp};
use blockwire_transport::rdma::{
    AccessFlags, AlignedBuf, CompletionQueue, MemoryRegion, ProtectionDomain, QpCaps, QpInit,
    QueuePair, RdmaProvider, RecvWr, SendOp, SendWr, WcStatus,
};
use support::bind_target;

const TARGET: &str = "iqn.2026-11.io.blockwire:iser-unanswered";
const MSG: usize = 16 << 10;
const RECVS: usize = 8;
/// Commands the target drops unanswered.
const DROPPED: u32 = 4000;
const QUEUE_DEPTH: u32 = 32;

/// A hand-made iSER initiator: one registered buffer to send from, `RECVS` to receive in.
struct RawIser {
    qp: SoftQp,
    send_cq: SoftCq,
    recv_cq: SoftCq,
    send_mr: SoftMr,
    recv_mr: SoftMr,
    /// Where the target RDMA-Writes READ data (one block).
    read_mr: SoftMr,
    /// Where the target RDMA-Reads WRITE data from (one block).
    write_mr: SoftMr,
}

impl RawIser {
    async fn connect(portal: std::net::SocketAddr) -> RawIser {
        RawIser::try_connect(portal)
            .await
            .expect("the target accepts the connection")
    }

    /// [`RawIser::connect`], or the target's refusal.
    async fn try_connect(
        portal: std::net::SocketAddr,
    ) -> Result<RawIser, blockwire_transport::rdma::RdmaError> {
        let p = SoftProvider::default();
        let pd = p.alloc_pd().unwrap();
        let (send_cq, recv_cq) = (p.create_cq(16).unwrap(), p.create_cq(16).unwrap());
        let init = QpInit::<SoftProvider> {
            pd: pd.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            caps: QpCaps {
                max_send_wr: 4,
                max_recv_wr: RECVS as u32,
                max_sge: 1,
            },
        };
        let local = AccessFlags::LOCAL_WRITE;
        let send_mr = pd.register(AlignedBuf::new(MSG), local).unwrap();
        let recv_mr = pd.register(AlignedBuf::new(RECVS * MSG), local).unwrap();
        let read_mr = pd
            .register(AlignedBuf::new(512), local | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let write_mr = pd
            .register(AlignedBuf::new(512), local | AccessFlags::REMOTE_READ)
            .unwrap();
        // RFC 7145 §9.2: no zero-based virtual addresses, no Send with Invalidate.
        let qp = p.connect(portal, init, &[0xc0, 0, 0, 0]).await?;
        let raw = RawIser {
            qp,
            send_cq,
            recv_cq,
            send_mr,
            recv_mr,
            read_mr,
            write_mr,
        };
        for i in 0..RECVS {
            raw.post_recv(i);
        }
        Ok(raw)
    }

    /// Whether the target has closed the connection within `within`: a
    /// posted receive then completes flushed. The initiator must not be
    /// expecting a message.
    async fn closed_within(&self, within: Duration) -> bool {
        match tokio::time::timeout(within, self.recv_cq.next()).await {
            Err(_) => false,
            Ok(c) => {
                let c = c.unwrap();
                assert_ne!(c.status, WcStatus::Success, "an unasked-for message");
                true
            }
        }
    }

    fn post_recv(&self, i: usize) {
        let sgl = vec![self.recv_mr.sge(i * MSG, MSG).unwrap()];
        let wr_id = i as u64;
        self.qp.post_recv(RecvWr { wr_id, sgl }).unwrap();
    }

    /// The Send of `pdu` behind an iSER header advertising `read`, its message
    /// written into the send buffer.
    fn message(&self, read: Option<RemoteBuffer>, pdu: &Pdu, signaled: bool) -> SendWr {
        self.message_with(IserHeader::Control { write: None, read }, pdu, signaled)
    }

    /// The Send of `pdu` behind `header`, its message written into the send
    /// buffer.
    fn message_with(&self, header: IserHeader, pdu: &Pdu, signaled: bool) -> SendWr {
        let mut msg = header.encode().to_vec();
        pdu.encode_into(&mut msg, Digests::NONE);
        self.send_mr.write_at(0, &msg).unwrap();
        let sgl = vec![self.send_mr.sge(0, msg.len()).unwrap()];
        SendWr {
            wr_id: 0,
            op: SendOp::Send,
            sgl,
            signaled,
        }
    }

    /// Sends `pdu` behind an iSER header advertising `read`, and waits for the Send.
    async fn send(&self, read: Option<RemoteBuffer>, pdu: &Pdu) {
        self.qp.post_send(self.message(read, pdu, true)).unwrap();
        let c = tokio::time::timeout(Duration::from_secs(10), self.send_cq.next())
            .await
            .expect("the Send completes")
            .unwrap();
        assert_eq!(c.status, WcStatus::Success, "a Send to the target");
    }

    /// Logs in straight to full feature phase as initiator `iqn...:{name}`: the
    /// CmdSN and ExpStatSN to go on with.
    async fn log_in(&self, name: &str) -> (u32, u32) {
        let name = format!("iqn.2026-11.io.blockwire:{name}");
        // Straight to the operational stage (no security negotiation is required); the
        // target's own offers are accepted as it makes them.
        let mut keys: Vec<(String, String)> = [
            ("InitiatorName", name.as_str()),
            ("TargetName", TARGET),
            ("SessionType", "Normal"),
            ("RDMAExtensions", "Yes"),
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("InitiatorRecvDataSegmentLength", "8192"),
            ("ImmediateData", "No"),
            ("InitialR2T", "Yes"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec();
        let mut sent: Vec<String> = Vec::new();
        let response = loop {
            assert!(sent.len() < 64, "the login does not end");
            sent.extend(keys.iter().map(|(k, _)| k.clone()));
            let login = login_request(Stage::Operational, Stage::FullFeature, 1, &keys);
            self.send(None, &login).await;
            let answer = self.receive().await;
            let Bhs::LoginResponse(r) = answer.bhs else {
                panic!("login answered {:?}", answer.bhs)
            };
            let text = String::from_utf8_lossy(&answer.data).replace('\0', " ");
            assert_eq!(r.status, LoginStatus::SUCCESS, "login: {text}");
            if r.transit {
                assert_eq!(r.nsg, Stage::FullFeature, "login: {text}");
                break r;
            }
            let declared = ["TargetPortalGroupTag", "MaxRecvDataSegmentLength"];
            keys = parse_text(&answer.data)
                .expect("the target's login keys")
                .into_iter()
                .filter(|(k, _)| !sent.contains(k) && !declared.contains(&k.as_str()))
                .collect();
        };
        (response.exp_cmd_sn, response.stat_sn.wrapping_add(1))
    }

    /// The target's next message, as a PDU.
    async fn receive(&self) -> Pdu {
        let c = tokio::time::timeout(Duration::from_secs(10), self.recv_cq.next())
            .await
            .expect("the target answers")
            .unwrap();
        assert_eq!(c.status, WcStatus::Success, "a receive");
        let i = c.wr_id as usize;
        let mut msg = vec![0u8; c.byte_len as usize];
        self.recv_mr.read_at(i * MSG, &mut msg).unwrap();
        self.post_recv(i);
        Pdu::decode(&msg[ISER_HEADER_LEN..], Digests::NONE)
            .expect("the target sends PDUs")
            .0
    }
}

/// A first Login Request (ISID ending in `session`) carrying `keys`,
/// asking to move from `csg` to `nsg`.
fn login_request<K: AsRef<str>, V: AsRef<str>>(
    csg: Stage,
    nsg: Stage,
    session: u8,
    keys: &[(K, V)],
) -> Pdu {
    Pdu::with_data(
        Bhs::LoginRequest(LoginRequest {
            transit: true,
            continue_bit: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0x2a, 0, 0, session],
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        }),
        encode_text(keys).unwrap(),
    )
}

/// The initiator's host: a current-thread runtime driven by a thread of its
/// own, until `done`. A task of it that blocks stalls all of it, as a host
/// that stops scheduling the initiator would.
struct StallableHost {
    handle: tokio::runtime::Handle,
    done: Arc<std::sync::atomic::AtomicBool>,
    driver: std::thread::JoinHandle<()>,
}

impl StallableHost {
    fn start() -> StallableHost {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let driver = std::thread::spawn({
            let done = done.clone();
            move || {
                runtime.block_on(async {
                    while !done.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            }
        });
        StallableHost {
            handle,
            done,
            driver,
        }
    }

    /// A hand-made initiator whose queue pair runs on this host.
    async fn connect(&self, portal: std::net::SocketAddr) -> Arc<RawIser> {
        Arc::new(
            self.handle
                .spawn(RawIser::connect(portal))
                .await
                .expect("the initiator's queue pair connects"),
        )
    }
}

/// A SCSI command on LUN 0: READ(10) of block 0 when `read`, else TEST UNIT
/// READY.
/// A target with a 1 MiB RAM LUN 0 under `settings`, serving iSER on the
/// soft provider: the target, and its iSER portal.
async fn iser_target(settings: FabricSettings) -> (support::TestTarget, std::net::SocketAddr) {
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(1 << 20))));
    let t = bind_target(TARGET, lu, settings).await.serve(false).await;
    let portal = t.start_iser().await;
    (t, portal)
}

fn command(itt: u32, cmd_sn: u32, exp_stat_sn: u32, read: bool) -> Pdu {
    let mut cdb = [0u8; 16];
    if read {
        cdb[..10].copy_from_slice(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    }
    Pdu::new(Bhs::ScsiCommand(ScsiCommand {
        immediate: false,
        final_bit: true,
        read,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::default(),
        itt,
        expected_data_transfer_length: if read { 512 } else { 0 },
        cmd_sn,
        exp_stat_sn,
        cdb,
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_commands_do_not_grow_the_advertised_buffer_table() {
    let settings = FabricSettings {
        queue_depth: QUEUE_DEPTH,
        ..FabricSettings::default()
    };
    let (t, portal) = iser_target(settings).await;
    let raw = RawIser::connect(portal).await;

    let (cmd_sn, stat_sn) = raw.log_in("unanswered").await;

    // READ(10) of one block, each with its own ITT and read buffer, each far outside
    // the window [ExpCmdSN, MaxCmdSN].
    for n in 0..DROPPED {
        let cmd_sn = cmd_sn.wrapping_add(1 << 20).wrapping_add(n);
        let command = command(0x1000 + n, cmd_sn, stat_sn, true);
        let buffer = RemoteBuffer {
            stag: 0x5000 + n,
            base_offset: 0x10_0000,
        };
        raw.send(Some(buffer), &command).await;
    }

    // The connection still serves: an immediate NOP-Out is answered.
    let ping = Pdu::new(Bhs::NopOut(NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: 7,
        ttt: RESERVED_TAG,
        cmd_sn,
        exp_stat_sn: stat_sn,
    }));
    raw.send(None, &ping).await;
    let pong = raw.receive().await;
    match pong.bhs {
        Bhs::NopIn(n) => assert_eq!((n.itt, n.stat_sn), (7, stat_sn), "the ping's NOP-In"),
        other => panic!("the ping was answered by {other:?}"),
    }

    let counters = &t.fabric.iser_counters;
    // Every command and the ping, after the login.
    let receives = counters.receives.load(Ordering::Relaxed);
    assert!(
        receives > u64::from(DROPPED),
        "the target received {receives} messages"
    );
    let high = counters.advertised_high.load(Ordering::Relaxed);
    let bound = 2 * (u64::from(QUEUE_DEPTH) + 64);
    eprintln!("at most {high} commands' buffers on record at once (bound {bound})");
    assert!(
        high <= bound,
        "{high} commands' buffers on record at once after {DROPPED} unanswered commands \
         (bound {bound})"
    );
    assert!(
        high > u64::from(QUEUE_DEPTH),
        "the table held commands: {high}"
    );
}

/// An initiator whose host stalls with the connection still up: its queue pair's
/// work (here the soft provider's tasks, on a runtime of their own) stops, so the
/// RDMA Write of a READ's data is never acknowledged. The target gives the work
/// request up after the NOP timeout and tears the connection down (flushing it before
/// its staging buffer is reused); once the host wakes, it finds the connection gone
/// and no status for the READ. Without that bound the target waited 30 s, and a
/// host that woke before then got the READ answered as if nothing had happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_request_a_stalled_initiator_never_completes_ends_the_connection() {
    let nop_timeout = Duration::from_secs(2);
    let settings = FabricSettings {
        nop_timeout,
        ..FabricSettings::default()
    };
    let (_target, portal) = iser_target(settings).await;

    // The initiator's queue pair runs on a host runtime of its own: a task of
    // it that blocks stalls all of it.
    let host = StallableHost::start();
    let (handle, done) = (host.handle.clone(), host.done.clone());
    let raw = host.connect(portal).await;
    let (cmd_sn, stat_sn) = raw.log_in("stalls").await;
    // A TEST UNIT READY takes the unit's power-on attention.
    let tur = command(0x76, cmd_sn, stat_sn, false);
    raw.send(None, &tur).await;
    match raw.receive().await.bhs {
        Bhs::ScsiResponse(r) => assert_eq!(r.itt, 0x76),
        other => panic!("TEST UNIT READY answered by {other:?}"),
    }
    let (cmd_sn, stat_sn) = (cmd_sn.wrapping_add(1), stat_sn.wrapping_add(1));

    let read = command(0x77, cmd_sn, stat_sn, true);
    let buffer = RemoteBuffer {
        stag: raw.read_mr.rkey(),
        base_offset: raw.read_mr.addr(),
    };
    // The host stalls as the command leaves, for twice the NOP timeout and a
    // second more: on its runtime, the Send is posted, the queue pair's writer
    // task runs once (the command goes out), and then nothing runs.
    let stall = 2 * nop_timeout + Duration::from_secs(1);
    let post = raw.message(Some(buffer), &read, false);
    handle.spawn({
        let raw = raw.clone();
        async move {
            raw.qp.post_send(post).unwrap();
            tokio::task::yield_now().await;
            std::thread::sleep(stall);
        }
    });
    tokio::time::sleep(stall + Duration::from_millis(100)).await;

    // Awake: the target has closed the connection, and the READ got no status.
    let mut answers = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !raw.qp.is_error() && tokio::time::Instant::now() < deadline {
        if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_millis(50), raw.recv_cq.next()).await
        {
            if c.status == WcStatus::Success {
                let mut msg = vec![0u8; c.byte_len as usize];
                raw.recv_mr
                    .read_at(c.wr_id as usize * MSG, &mut msg)
                    .unwrap();
                answers.push(Pdu::decode(&msg[ISER_HEADER_LEN..], Digests::NONE).map(|p| p.0.bhs));
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    assert!(
        raw.qp.is_error(),
        "the connection still stands {stall:?} into the stall; the target sent {answers:?}"
    );
    drop(raw);
    host.driver.join().unwrap();
}

/// A connection that ends (here, the target shutting down) while the RDMA Read
/// of a WRITE's solicited data is still posted gives the Read's staging buffer
/// back to the pool: the queue pair's teardown flushes the Read, and that
/// completion is still handed over. Before, the completion pump stopped with
/// the connection, so the Read waited out the NOP timeout and its buffer was
/// given up for good: every such teardown shrank the portal's pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_ends_during_an_rdma_read_keeps_its_staging_buffer() {
    // Longer than the connection's end takes (the writer's last sends are
    // waited for 5 s): the Read's own timeout does not end it first.
    let nop_timeout = Duration::from_secs(6);
    let settings = FabricSettings {
        nop_timeout,
        logout_grace: Duration::from_millis(200),
        ..FabricSettings::default()
    };
    let (t, portal) = iser_target(settings).await;
    // The initiator's queue pair runs on a host runtime of its own, which
    // stalls below: the target's RDMA Read then gets no answer.
    let host = StallableHost::start();
    let (handle, done) = (host.handle.clone(), host.done.clone());
    let raw = host.connect(portal).await;
    let (cmd_sn, stat_sn) = raw.log_in("ends-mid-read").await;
    let tur = command(0x76, cmd_sn, stat_sn, false);
    raw.send(None, &tur).await;
    let _ = raw.receive().await;
    let (cmd_sn, stat_sn) = (cmd_sn.wrapping_add(1), stat_sn.wrapping_add(1));

    // WRITE(10) of one block, its data solicited (InitialR2T=Yes, no immediate
    // data): the target RDMA-Reads it from the advertised write buffer.
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    let write = Pdu::new(Bhs::ScsiCommand(ScsiCommand {
        immediate: false,
        final_bit: true,
        read: false,
        write: true,
        attr: TaskAttr::Simple,
        lun: Lun::default(),
        itt: 0x77,
        expected_data_transfer_length: 512,
        cmd_sn,
        exp_stat_sn: stat_sn,
        cdb,
    }));
    let header = IserHeader::Control {
        write: Some(RemoteBuffer {
            stag: raw.write_mr.rkey(),
            base_offset: raw.write_mr.addr(),
        }),
        read: None,
    };
    let post = raw.message_with(header, &write, false);
    let stall = Duration::from_secs(15);
    handle.spawn({
        let raw = raw.clone();
        async move {
            raw.qp.post_send(post).unwrap();
            tokio::task::yield_now().await;
            std::thread::sleep(stall);
        }
    });
    let counters = &t.fabric.iser_counters;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while counters.rdma_reads.load(Ordering::Relaxed) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the target never posted the RDMA Read"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The connection ends with the Read posted and unanswered.
    t.stop.send(true).unwrap();
    // Past the NOP timeout and the wait for a flush after it, with the
    // initiator still stalled.
    tokio::time::sleep(nop_timeout + Duration::from_secs(7)).await;
    let given_up = counters.staging_bytes_given_up.load(Ordering::Relaxed);
    done.store(true, Ordering::Relaxed);
    assert_eq!(given_up, 0, "staging bytes given up for good");
    host.driver.join().unwrap();
}

/// The iSER login phase is bounded as a whole, as over TCP: a connection
/// that sends no login is closed at `login_deadline` (here 1 s), not only
/// once the wait for one message (`login_timeout`, here a minute) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iser_login_is_closed_at_its_deadline() {
    let (_t, portal) = iser_target(FabricSettings {
        login_timeout: Duration::from_secs(60),
        login_deadline: Duration::from_secs(1),
        ..FabricSettings::default()
    })
    .await;
    let raw = RawIser::connect(portal).await;
    assert!(
        raw.closed_within(Duration::from_secs(20)).await,
        "a silent iSER connection was kept past its login deadline"
    );
}

/// With room for one iSER login in progress, a second connection is
/// refused when it asks to connect, before the target registers anything
/// for it; once the first has logged in, a third is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iser_connection_past_the_logins_in_progress_is_refused() {
    let (_t, portal) = iser_target(FabricSettings {
        max_logins_in_progress: 1,
        ..FabricSettings::default()
    })
    .await;
    let first = RawIser::connect(portal).await;
    assert!(
        RawIser::try_connect(portal).await.is_err(),
        "a second connection was accepted while the first logs in"
    );
    first.log_in("first").await;
    // The first's slot goes back once the target has seen its final Login
    // Response sent, which may be just after the initiator read it.
    let began = std::time::Instant::now();
    let third = loop {
        match RawIser::try_connect(portal).await {
            Ok(raw) => break raw,
            Err(e) => assert!(
                began.elapsed() < Duration::from_secs(10),
                "a connection after the first logged in was refused: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    third.log_in("third").await;
}

/// A login over iSER that fails authentication (AuthMethod=None offered to
/// a target that requires CHAP) is told so after the refusal delay, 2 s,
/// as over TCP: guessing a CHAP secret over iSER is no faster than over
/// TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iser_authentication_failure_is_answered_after_its_delay() {
    use blockwire_target::iscsi::catalog::{Acl, Catalog, ChapSecret};
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(1 << 20))));
    let unused_portal = "127.0.0.1:3260".parse().unwrap();
    let mut catalog = Catalog::one_target(TARGET, unused_portal, Acl::Any, Arc::new(lu));
    let mut entry = Arc::try_unwrap(catalog.targets.pop().unwrap()).unwrap();
    entry.auth.incoming = vec![ChapSecret {
        user: "alice".into(),
        secret: "alice-secret-12".into(),
    }];
    catalog.targets.push(Arc::new(entry));
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let fabric = blockwire_target::iscsi::Fabric::new(
        Arc::new(catalog),
        FabricSettings::default(),
        shutdown,
    );
    let portal = blockwire_target::iscsi::iser::start(
        fabric,
        "127.0.0.1:0".parse().unwrap(),
        blockwire_transport::rdma::any::Backend::Soft,
        None,
        1,
    )
    .await
    .expect("an iSER portal on the soft RDMA provider");
    let raw = RawIser::connect(portal).await;
    let keys = [
        ("InitiatorName", "iqn.2026-11.io.blockwire:no-secret"),
        ("TargetName", TARGET),
        ("SessionType", "Normal"),
        ("AuthMethod", "None"),
    ];
    let login = login_request(Stage::Security, Stage::Operational, 2, &keys);
    let asked = std::time::Instant::now();
    raw.send(None, &login).await;
    let answer = raw.receive().await;
    let waited = asked.elapsed();
    assert!(
        matches!(answer.bhs, Bhs::LoginResponse(ref l) if l.status == LoginStatus::AUTHENTICATION_FAILURE),
        "{:?}",
        answer.bhs
    );
    assert!(
        waited >= Duration::from_millis(1900),
        "an iSER authentication failure answered after {waited:?}"
    );
}
