//! Pairs blockwire's initiator and target over both RDMA data paths, on the
//! soft RDMA provider over loopback in this process:
//! - iSER (RFC 7145): [`IserSession`] logs in to the target's iSER portal
//!   with RDMAExtensions=Yes; the target moves READ data by RDMA Write into
//!   the read STag at each Data-In's offset and WRITE data by RDMA Read from
//!   the write STag for each R2T its connection machine issues (one per
//!   MaxBurstLength);
//! - RDMA-assisted iSCSI (the seed papers): [`AssistedSession`] logs in over
//!   TCP with keys and digests the fuzzer picks, binds its RDMA connection
//!   with the token the target granted, and advertises each command's
//!   buffers (one or two pieces, a scatter list) in a descriptor; writes up
//!   to the inline threshold go as immediate data over TCP instead.
//!
//! Each command's buffers are registered by the strategy the fuzzer picks
//! (per command, pin-down cache, fast registration with batched
//! deregistration for RDMA-assisted sessions, arena). LUN 0 is built by
//! `storage.rs`: RAM, or files with the data paths a daemon starts
//! (sendfile and engine READs, whose payloads become RDMA Writes, and
//! double-buffered WRITEs, fed by the RDMA Reads). Batches of READs and
//! WRITEs run several at once; READs may have an Expected Data Transfer
//! Length other than the CDB's.
//!
//! Checked: the session logs in (and RDMA-assisted sessions bind, unless
//! DataDigest=CRC32C keeps their data on TCP); every
//! command completes GOOD with the residual RFC 7143 §11.4.5 gives and the
//! bytes a model of the LUN holds (commands of one batch never overlap),
//! and a READ buffer longer than the data keeps its zeros past them;
//! nothing stalls; the data went by RDMA (iSER: the target's RDMA byte
//! count covers what was written; RDMA-assisted: every command that could
//! be offloaded was, and no transfer failed over to TCP); after logout and
//! shutdown the listeners refuse connections and every task of the runtime
//! ends, so nothing is left over for the next input.
#![no_main]

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[path = "../common/commands.rs"]
mod commands;
#[path = "../common/lun_files.rs"]
mod lun_files;
#[path = "../common/storage.rs"]
mod storage;

use blockwire_initiator::iser::IserSession;
use blockwire_initiator::rdma::{
    AssistedSession, FmrdConfig, Mode, RdmaBuf, RdmaConfig, RegConfig,
};
use blockwire_initiator::{rw16, Completion, InitiatorConfig, Residual};
use blockwire_pdu::scsi::ScsiStatus;
use blockwire_target::iscsi::connection::fuzzing::{fabric_serving_unit, TARGET};
use blockwire_target::iscsi::portal::Portal;
use blockwire_target::iscsi::{iser, Fabric, FabricSettings};
use blockwire_transport::rdma::any::Backend;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

use commands::{blocks_of, edtl, pattern, Io, BLOCK, LUN_BYTES};
use tokio::runtime::Runtime;

const INITIATOR: &str = "iqn.2026-11.io.blockwire:rdma-paired";
const SCRATCH_PREFIX: &str = "blockwire-fuzz-rdma-";
/// How long one batch, a login or a logout may take before it counts as a
/// stall.
const LIMIT: Duration = Duration::from_secs(20);
/// How long the listeners may take to close, and the tasks to end, after
/// shutdown: generous, so that a slow machine is not a failure (a listener
/// or task that never ends still is).
const SETTLE: Duration = Duration::from_secs(10);

#[derive(Arbitrary, Debug)]
struct Input {
    storage: storage::Storage,
    transport: Transport,
    registration: u8,
    /// MaxBurstLength the initiator offers.
    max_burst: u8,
    data_pdu_in_order: bool,
    initiator_queue_depth: u8,
    target_queue_depth: u8,
    batches: Vec<Vec<Io>>,
}

#[derive(Arbitrary, Debug)]
enum Transport {
    Iser,
    Assisted {
        /// Writes up to this many bytes go as immediate data over TCP.
        inline_threshold: u8,
        immediate_data: bool,
        initial_r2t: bool,
        header_digest: bool,
        data_digest: bool,
    },
}

/// Burst sizes on and between the target's staging buffer classes.
const BURSTS: [u32; 5] = [4096, 8192, 65_536, 262_144, 1 << 20];

fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

fn registration(n: u8, iser: bool) -> RegConfig {
    match n % 5 {
        0 => RegConfig::Dynamic,
        1 => RegConfig::PinDownCache { capacity: 1 },
        2 => RegConfig::PinDownCache { capacity: 16 },
        // An iSER command names one STag per direction; fast registration
        // may give a buffer several regions, so iSER takes the arena here.
        3 if !iser => RegConfig::Fmrd(FmrdConfig {
            capacity: 4,
            slots: 8,
            dereg_threshold: 2,
        }),
        // Room for a whole batch: 8 commands of at most 600 blocks and
        // 1 KiB of extra EDTL each.
        _ => RegConfig::Arena { bytes: 8 << 20 },
    }
}

/// The initiator's end of either data path.
enum Client {
    Iser(IserSession),
    Assisted(AssistedSession),
}

impl Client {
    fn alloc(&self, len: usize) -> RdmaBuf {
        match self {
            Client::Iser(s) => s.alloc(len),
            Client::Assisted(s) => s.alloc(len),
        }
        .expect("a registered buffer")
    }

    /// Runs `cdb` with `bufs` as its data buffers (their lengths add up to
    /// the Expected Data Transfer Length).
    async fn run(&self, cdb: &[u8], write: bool, bufs: &mut [RdmaBuf]) -> Completion {
        let r = match (self, write) {
            (Client::Iser(s), true) => s.execute(0, cdb, None, Some(&bufs[0])).await,
            (Client::Iser(s), false) => s.execute(0, cdb, Some(&mut bufs[0]), None).await,
            (Client::Assisted(s), true) => s.write_cdb(0, cdb, bufs).await,
            (Client::Assisted(s), false) => s.read_cdb(0, cdb, bufs).await,
        };
        r.unwrap_or_else(|e| panic!("{cdb:02x?} failed: {e}"))
    }

    async fn logout(self) {
        let r = match self {
            Client::Iser(s) => tokio::time::timeout(LIMIT, s.logout()).await,
            Client::Assisted(s) => tokio::time::timeout(LIMIT, s.logout()).await,
        };
        r.expect("logout in time").expect("logout");
    }
}

/// Runs `io` and checks its completion against `model` (the LUN before the
/// batch: commands of a batch never overlap). Returns what a WRITE stored,
/// for the model.
async fn run(c: Arc<Client>, io: Io, model: Arc<Vec<u8>>) -> Option<(usize, Vec<u8>)> {
    let range = blocks_of(&io);
    let blocks = (range.end - range.start) as u32;
    let len = blocks as usize * BLOCK;
    let at = range.start as usize * BLOCK;
    let expected = edtl(&io, len);
    let cdb = rw16(io.write, range.start, blocks, false);
    // iSER advertises one buffer per direction; RDMA-assisted may cut it.
    let cut = match *c {
        Client::Assisted(_) => usize::from(io.split) % expected,
        Client::Iser(_) => 0,
    };
    let mut bufs: Vec<RdmaBuf> = if cut == 0 {
        vec![c.alloc(expected)]
    } else {
        vec![c.alloc(cut), c.alloc(expected - cut)]
    };
    let data = pattern(io.seed, len);
    if io.write {
        let mut from = 0;
        for b in &mut bufs {
            let n = b.len();
            b.write_at(0, &data[from..from + n])
                .expect("the write data in place");
            from += n;
        }
    }
    let done = c.run(&cdb, io.write, &mut bufs).await;
    assert_eq!(done.status, ScsiStatus::GOOD, "{io:?}: {done:?}");
    // Residuals (RFC 7143 §11.4.5): overflow when the CDB wanted more than
    // the Expected Data Transfer Length, underflow when less.
    let residual = match expected.cmp(&len) {
        std::cmp::Ordering::Equal => Residual::None,
        std::cmp::Ordering::Less => Residual::Overflow((len - expected) as u32),
        std::cmp::Ordering::Greater => Residual::Underflow((expected - len) as u32),
    };
    assert_eq!(
        done.residual, residual,
        "residual of {io:?} (EDTL {expected})"
    );
    if io.write {
        return Some((at, data));
    }
    let moved = expected.min(len);
    assert_eq!(done.transferred, moved, "{io:?}: bytes transferred");
    let mut got = Vec::with_capacity(expected);
    for b in &bufs {
        let mut piece = vec![0u8; b.len()];
        b.read_at(0, &mut piece).expect("the read data");
        got.extend_from_slice(&piece);
    }
    // A buffer longer than the data (underflow) keeps its zeros past them:
    // the target places nothing beyond what it reports.
    if let Some(i) = got[moved..].iter().position(|&b| b != 0) {
        panic!(
            "{io:?} (cut at {cut}): byte {} of the {expected}-byte buffer was written, \
             past the {moved} bytes of data",
            moved + i
        );
    }
    let got = &got[..moved];
    if got[..] != model[at..at + moved] {
        let i = got
            .iter()
            .zip(&model[at..])
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "{io:?} (cut at {cut}): byte {i} read {:#04x}, the model holds {:#04x}",
            got[i],
            model[at + i]
        );
    }
    None
}

/// Starts the listeners `transport` needs on `fabric` and logs in. Returns
/// the session and the addresses that must refuse connections after
/// shutdown.
async fn connect(
    input: &Input,
    fabric: &Arc<Fabric>,
) -> (Client, Vec<SocketAddr>, Option<tokio::task::JoinHandle<()>>) {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let mut config = InitiatorConfig::new(INITIATOR);
    config.max_burst_length = BURSTS[usize::from(input.max_burst) % BURSTS.len()];
    config.data_pdu_in_order = input.data_pdu_in_order;
    config.queue_depth = 1 + usize::from(input.initiator_queue_depth % 8);
    let iser = matches!(input.transport, Transport::Iser);
    let mut rdma = RdmaConfig {
        registration: registration(input.registration, iser),
        backend: Backend::Soft,
        ..RdmaConfig::default()
    };
    match input.transport {
        Transport::Iser => {
            let portal = iser::start(fabric.clone(), any, Backend::Soft, None, 1)
                .await
                .expect("the iSER portal");
            let s = IserSession::connect(config, rdma, portal, TARGET)
                .await
                .unwrap_or_else(|e| panic!("iSER login: {e}"));
            (Client::Iser(s), vec![portal], None)
        }
        Transport::Assisted {
            inline_threshold,
            immediate_data,
            initial_r2t,
            header_digest,
            data_digest,
        } => {
            let endpoint = fabric.start_rdma(any).await.expect("the RDMA service");
            let portal = Portal::bind(any, 1).await.expect("the TCP portal");
            let addr = portal.local_addr().expect("the portal's address");
            let serving = tokio::spawn(portal.run(fabric.clone()));
            config.immediate_data = immediate_data;
            config.initial_r2t = initial_r2t;
            config.header_digest = header_digest;
            config.data_digest = data_digest;
            rdma.inline_threshold = threshold(inline_threshold);
            let s = AssistedSession::connect(config, rdma, &addr.to_string(), TARGET)
                .await
                .unwrap_or_else(|e| panic!("RDMA-assisted login: {e}"));
            let expected = if offloads(&input.transport) {
                Mode::Offloaded
            } else {
                Mode::Plain
            };
            assert_eq!(s.mode().await, expected, "the session's data path");
            (Client::Assisted(s), vec![addr, endpoint], Some(serving))
        }
    }
}

async fn session(input: &Input) {
    let settings = FabricSettings {
        queue_depth: u32::from(input.target_queue_depth % 16) + 1,
        data_pdu_in_order: input.data_pdu_in_order,
        ..FabricSettings::default()
    };
    let (unit, paths) = storage::lun0(&input.storage, SCRATCH_PREFIX, LUN_BYTES as u64);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let fabric = fabric_serving_unit(settings, unit, paths, shutdown);
    let (client, listeners, serving) = tokio::time::timeout(LIMIT, connect(input, &fabric))
        .await
        .expect("login in time");
    let client = Arc::new(client);
    let mut model = Arc::new(vec![0u8; LUN_BYTES]);
    let (mut wrote, mut offloadable) = (0u64, 0u64);
    for batch in input.batches.iter().take(8) {
        let mut tasks = tokio::task::JoinSet::new();
        for io in commands::disjoint(batch) {
            // What the initiator sends by RDMA: every READ, and WRITEs above
            // the inline threshold.
            let r = blocks_of(&io);
            let bytes = (r.end - r.start) as usize * BLOCK;
            if offloads(&input.transport)
                && (!io.write || bytes > inline_threshold(&input.transport))
            {
                offloadable += 1;
            }
            tasks.spawn(run(client.clone(), io, model.clone()));
        }
        let stored = tokio::time::timeout(LIMIT, tasks.join_all())
            .await
            .unwrap_or_else(|_| panic!("a batch did not complete in {LIMIT:?}"));
        let m = Arc::make_mut(&mut model);
        for (at, data) in stored.into_iter().flatten() {
            wrote += data.len() as u64;
            m[at..at + data.len()].copy_from_slice(&data);
        }
    }
    let client = Arc::into_inner(client).expect("no command left holding the session");
    match &client {
        Client::Iser(_) => {
            // Every byte went one-sided: the target's Sends carry no data.
            let moved = fabric.iser_counters.rdma_bytes.load(Ordering::Relaxed);
            assert!(
                moved >= wrote,
                "{wrote} bytes written but only {moved} moved by RDMA"
            );
        }
        Client::Assisted(s) => {
            let st = s.stats();
            assert_eq!(
                st.failed_transfers, 0,
                "transfers failed over to TCP: {st:?}"
            );
            assert_eq!(
                st.offloaded_reads + st.offloaded_writes,
                offloadable,
                "commands offloaded: {st:?}"
            );
        }
    }
    client.logout().await;
    stop.send(true).expect("the fabric listens for shutdown");
    if let Some(serving) = serving {
        tokio::time::timeout(LIMIT, serving)
            .await
            .expect("the TCP portal ends after shutdown")
            .expect("the TCP portal's task");
    }
    // The listeners close once they see the shutdown: a connection then fails.
    for addr in listeners {
        let closed =
            settles(|| async move { tokio::net::TcpStream::connect(addr).await.is_err() }).await;
        assert!(closed, "{addr} still accepts {SETTLE:?} after shutdown");
    }
    drop(fabric);
    // The connections' tasks (receive and send loops, completion pumps, the
    // soft provider's responders) end with them.
    let metrics = tokio::runtime::Handle::current().metrics();
    let ended = settles(|| std::future::ready(metrics.num_alive_tasks() == 0)).await;
    assert!(
        ended,
        "{} task(s) still alive {SETTLE:?} after logout and shutdown",
        metrics.num_alive_tasks()
    );
}

/// Whether `done` comes true within [`SETTLE`], asked every 5 ms.
async fn settles<F: std::future::Future<Output = bool>>(mut done: impl FnMut() -> F) -> bool {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        if done().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether the data go by RDMA: always on iSER; on RDMA-assisted sessions
/// unless DataDigest=CRC32C was negotiated (a data digest cannot cover what
/// RDMA places, so such a session keeps its data on TCP).
fn offloads(t: &Transport) -> bool {
    !matches!(
        t,
        Transport::Assisted {
            data_digest: true,
            ..
        }
    )
}

/// Writes up to this many bytes go as immediate data (RDMA-assisted only).
fn inline_threshold(t: &Transport) -> usize {
    match *t {
        Transport::Iser => 0,
        Transport::Assisted {
            inline_threshold, ..
        } => threshold(inline_threshold),
    }
}

fn threshold(n: u8) -> usize {
    [0, 512, 8 << 10, 64 << 10][usize::from(n % 4)]
}

fuzz_target!(|input: Input| {
    runtime().block_on(session(&input));
});
