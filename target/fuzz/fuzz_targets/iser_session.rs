//! Pairs blockwire's iSER initiator ([`IserSession`]) with blockwire's iSER
//! target (RFC 7145) on the soft RDMA provider over loopback, in this
//! process: the initiator logs in with RDMAExtensions=Yes and keys the
//! fuzzer picks, then runs batches of READs and WRITEs of sizes the fuzzer
//! picks, several in flight at once, each with its buffer registered by the
//! strategy the fuzzer picks (per command, pin-down cache, arena). The
//! target moves every byte one-sided: READ data by RDMA Write into the
//! read STag at each Data-In's offset, WRITE data by RDMA Read from the
//! write STag for each R2T its connection machine issues (one per
//! MaxBurstLength), over LUN 0 as `storage.rs` builds it: RAM, or files
//! with the data paths a daemon starts (sendfile and engine READs, whose
//! payloads become RDMA Writes, and double-buffered WRITEs, fed by the
//! RDMA Reads); READs whose Expected Data Transfer Length differs from the
//! CDB's.
//!
//! Checked: the session logs in and every command completes GOOD with the
//! residual RFC 7143 §11.4.5 gives and the bytes a model of the LUN holds
//! (commands of one batch never overlap); nothing stalls; the target's
//! counters show the data went by RDMA, never in a PDU; after logout and
//! shutdown the portal refuses new connections and the connection's tasks
//! end, so nothing is left over for the next input.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[path = "../common/lun_files.rs"]
mod lun_files;
#[path = "../common/storage.rs"]
mod storage;

use blockwire_initiator::iser::IserSession;
use blockwire_initiator::rdma::{RdmaConfig, RegConfig};
use blockwire_initiator::{rw16, InitiatorConfig, Residual};
use blockwire_pdu::scsi::ScsiStatus;
use blockwire_target::iscsi::connection::fuzzing::{fabric_serving, TARGET};
use blockwire_target::iscsi::{iser, FabricSettings};
use blockwire_transport::rdma::any::Backend;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

const BLOCK: usize = 512;
const LUN_BYTES: usize = 1 << 20;
const INITIATOR: &str = "iqn.2026-11.io.blockwire:iser-paired";
const SCRATCH_PREFIX: &str = "blockwire-fuzz-iser-";
/// How long one batch may take before it counts as a stall.
const BATCH_LIMIT: Duration = Duration::from_secs(20);

#[derive(Arbitrary, Debug)]
struct Input {
    storage: storage::Storage,
    registration: u8,
    /// MaxBurstLength the initiator offers: each R2T, so each RDMA Read.
    max_burst: u8,
    data_pdu_in_order: bool,
    initiator_queue_depth: u8,
    target_queue_depth: u8,
    batches: Vec<Vec<Io>>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Io {
    write: bool,
    lba: u16,
    blocks: u16,
    seed: u8,
    /// For a READ: an Expected Data Transfer Length other than the CDB's
    /// (0: the same; odd: shorter by this many bytes; even: longer).
    edtl_off: u16,
    /// Whole 4 KiB units, as O_DIRECT engine paths take them.
    aligned: bool,
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

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (usize::from(seed) * 131 + i * 7 + i / 509) as u8)
        .collect()
}

/// The block range of `io`, clamped to the LUN.
fn blocks_of(io: &Io) -> std::ops::Range<u64> {
    let lun_blocks = (LUN_BYTES / BLOCK) as u64;
    let unit = if io.aligned { 4096 / BLOCK as u64 } else { 1 };
    let lba = u64::from(io.lba) % lun_blocks / unit * unit;
    let blocks = (1 + u64::from(io.blocks) % 600).div_ceil(unit) * unit;
    lba..lba + blocks.min(lun_blocks - lba)
}

/// The Expected Data Transfer Length of `io` whose CDB moves `len` bytes.
fn edtl(io: &Io, len: usize) -> usize {
    if io.write {
        return len;
    }
    let off = usize::from(io.edtl_off % 1024);
    match off {
        0 => len,
        _ if off % 2 == 1 => len - off.min(len - 1),
        _ => len + off,
    }
}

fn registration(n: u8) -> RegConfig {
    match n % 4 {
        0 => RegConfig::Dynamic,
        1 => RegConfig::PinDownCache { capacity: 1 },
        2 => RegConfig::PinDownCache { capacity: 16 },
        // Room for a whole batch: 8 commands of at most 600 blocks and
        // 1 KiB of extra EDTL each.
        _ => RegConfig::Arena { bytes: 8 << 20 },
    }
}

/// Runs `io` on the session and checks its completion against `model`
/// (the LUN before the batch: commands of a batch never overlap). Returns
/// what a WRITE stored, for the model.
async fn run(s: Arc<IserSession>, io: Io, model: Arc<Vec<u8>>) -> Option<(usize, Vec<u8>)> {
    let range = blocks_of(&io);
    let blocks = (range.end - range.start) as u32;
    let len = blocks as usize * BLOCK;
    let at = range.start as usize * BLOCK;
    let expected = edtl(&io, len);
    let cdb = rw16(io.write, range.start, blocks, false);
    let mut buf = s.alloc(expected).expect("a registered buffer");
    let data = pattern(io.seed, len);
    let c = if io.write {
        buf.write_at(0, &data).expect("the write data in place");
        s.execute(0, &cdb, None, Some(&buf)).await
    } else {
        s.execute(0, &cdb, Some(&mut buf), None).await
    }
    .unwrap_or_else(|e| panic!("{io:?} (EDTL {expected}) failed: {e}"));
    assert_eq!(c.status, ScsiStatus::GOOD, "{io:?}: status {c:?}");
    // Residuals (RFC 7143 §11.4.5): overflow when the CDB wanted more than
    // the Expected Data Transfer Length, underflow when less.
    let residual = match expected.cmp(&len) {
        std::cmp::Ordering::Equal => Residual::None,
        std::cmp::Ordering::Less => Residual::Overflow((len - expected) as u32),
        std::cmp::Ordering::Greater => Residual::Underflow((expected - len) as u32),
    };
    assert_eq!(c.residual, residual, "residual of {io:?} (EDTL {expected})");
    if io.write {
        return Some((at, data));
    }
    let moved = expected.min(len);
    assert_eq!(c.transferred, moved, "{io:?}: bytes transferred");
    let mut got = vec![0u8; moved];
    buf.read_at(0, &mut got).expect("the read data");
    if got[..] != model[at..at + moved] {
        let i = got
            .iter()
            .zip(&model[at..])
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "{io:?}: byte {i} read {:#04x}, the model holds {:#04x}",
            got[i],
            model[at + i]
        );
    }
    None
}

async fn session(input: &Input) {
    let settings = FabricSettings {
        queue_depth: u32::from(input.target_queue_depth % 16) + 1,
        data_pdu_in_order: input.data_pdu_in_order,
        ..FabricSettings::default()
    };
    let (store, paths) = storage::lun0(&input.storage, SCRATCH_PREFIX, LUN_BYTES as u64);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let fabric = fabric_serving(settings, store, paths, shutdown);
    let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let portal = iser::start(fabric.clone(), any, Backend::Soft, None, 1)
        .await
        .expect("the iSER portal");
    let mut config = InitiatorConfig::new(INITIATOR);
    config.max_burst_length = BURSTS[usize::from(input.max_burst) % BURSTS.len()];
    config.data_pdu_in_order = input.data_pdu_in_order;
    config.queue_depth = 1 + usize::from(input.initiator_queue_depth % 8);
    let rdma = RdmaConfig {
        registration: registration(input.registration),
        backend: Backend::Soft,
        ..RdmaConfig::default()
    };
    let s = Arc::new(
        IserSession::connect(config, rdma, portal, TARGET)
            .await
            .unwrap_or_else(|e| panic!("iSER login: {e}")),
    );
    let mut model = Arc::new(vec![0u8; LUN_BYTES]);
    let mut wrote = 0u64;
    for batch in input.batches.iter().take(8) {
        let mut taken: Vec<std::ops::Range<u64>> = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        for io in batch.iter().take(8) {
            let r = blocks_of(io);
            if taken.iter().any(|t| t.start < r.end && r.start < t.end) {
                continue;
            }
            taken.push(r);
            tasks.spawn(run(s.clone(), *io, model.clone()));
        }
        let stored = tokio::time::timeout(BATCH_LIMIT, tasks.join_all())
            .await
            .unwrap_or_else(|_| panic!("a batch did not complete in {BATCH_LIMIT:?}"));
        let m = Arc::make_mut(&mut model);
        for (at, data) in stored.into_iter().flatten() {
            wrote += data.len() as u64;
            m[at..at + data.len()].copy_from_slice(&data);
        }
    }
    // Every byte went one-sided: the target's Sends carry no data.
    let counters = &fabric.iser_counters;
    let rdma_bytes = counters
        .rdma_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        rdma_bytes >= wrote,
        "{wrote} bytes written but only {rdma_bytes} moved by RDMA"
    );
    let s = Arc::into_inner(s).expect("no command left holding the session");
    tokio::time::timeout(BATCH_LIMIT, s.logout())
        .await
        .expect("logout in time")
        .expect("logout");
    stop.send(true).expect("the fabric listens for shutdown");
    // The listener closes once it sees the shutdown: a connection then fails.
    let mut closed = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(portal).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        closed,
        "the iSER portal {portal} still accepts after shutdown"
    );
}

fuzz_target!(|input: Input| {
    runtime().block_on(session(&input));
});
