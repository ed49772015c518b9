//! Synchronized sends vs the serial baseline on an emulated disk and
//! network (the GMBlock paper's Exp. 2a/2b, the synchronized-sends paper's Fig. 5).
//!
//! `cargo bench -p blockwire-target --features bench --bench synchro` runs the full sweep;
//! without `--bench` (as `cargo test --benches` runs it) it does a short
//! smoke run. `BW_ITERS` sets commands per point (default 24).

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use blockwire_target::datapath::emulate::ThrottledEngine;
use blockwire_target::datapath::emulate::{ThrottledProducer, ThrottledSink};
use blockwire_target::datapath::sink::{DiscardSink, StreamSink};
use blockwire_target::datapath::*;

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

struct Rates {
    name: String,
    disk: f64,
    net: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Runs `iters` back-to-back READs; returns (median seconds per command,
/// mean un-overlapped send seconds).
fn run_reads(
    p: &Pipeline,
    src: &Source,
    len: usize,
    cfg: &ReadConfig,
    sink: &mut dyn ChunkSink,
    iters: usize,
) -> (f64, f64) {
    // One warm-up command.
    p.read(src, 0, len, cfg, sink).expect("read");
    let mut t = Vec::new();
    let mut unover = 0.0;
    for _ in 0..iters {
        let r = p.read(src, 0, len, cfg, sink).expect("read");
        t.push(r.timers.phase(Phase::Total).as_secs_f64());
        unover += r.timers.phase(Phase::SendUnoverlapped).as_secs_f64();
    }
    (median(t), unover / iters as f64)
}

fn mbps(len: usize, secs: f64) -> f64 {
    len as f64 / secs / 1e6
}

fn pool() -> BufferPool {
    BufferPool::new(&[(64 * KIB, 16), (256 * KIB, 8), (MIB, 8), (4 * MIB, 4)])
}

struct Row {
    len: usize,
    chunk: usize,
    mode: &'static str,
    secs: f64,
    serial: f64,
    model: f64,
    unover: f64,
}

fn print_header() {
    println!(
        "{:>6} {:>6} {:<7} {:>8} {:>8} {:>9} {:>8} {:>10}",
        "l", "c", "mode", "MB/s", "gain", "model", "vs.model", "unovl_us"
    );
}

fn print_row(r: &Row) {
    let gain = if r.mode == "serial" {
        "-".to_string()
    } else {
        format!("{:+.0}%", (r.serial / r.secs - 1.0) * 100.0)
    };
    println!(
        "{:>6} {:>6} {:<7} {:>8.0} {:>8} {:>9.0} {:>+7.1}% {:>10.0}",
        size(r.len),
        if r.mode == "serial" {
            "-".into()
        } else {
            size(r.chunk)
        },
        r.mode,
        mbps(r.len, r.secs),
        gain,
        mbps(r.len, r.model),
        (r.secs / r.model - 1.0) * 100.0,
        r.unover * 1e6,
    );
}

fn size(b: usize) -> String {
    if b >= MIB {
        format!("{}M", b / MIB)
    } else {
        format!("{}K", b / KIB)
    }
}

/// Paper-rate sweep over a single emulated disk stream.
fn sweep(
    rates: &Rates,
    sizes: &[usize],
    chunks: &[usize],
    iters: usize,
    src: &Source,
    inner: Option<Arc<dyn Engine>>,
    tcp: bool,
) -> Vec<Row> {
    println!(
        "\n## {}: r_disk = {:.0} MB/s, r_net = {:.0} MB/s, one disk stream{}",
        rates.name,
        rates.disk / 1e6,
        rates.net / 1e6,
        if tcp {
            ", data really moved (O_DIRECT io_uring reads, TCP loopback sends)"
        } else {
            ", bogus data (timing only)"
        }
    );
    println!("   model: serial l/r_disk + l/r_net; overlapped l/r_disk + c/r_net");
    let pl = pool();
    let eng: Arc<dyn Engine> = Arc::new(ThrottledEngine::new(pl, 1, rates.disk, inner));
    let p = Pipeline::new(eng);
    let mut rows = Vec::new();
    print_header();
    for &len in sizes {
        let mk_sink = |order: SendOrder| -> Box<dyn ChunkSink> {
            if tcp {
                Box::new(ThrottledSink::new(
                    tcp_sink(),
                    rates.net,
                    Duration::from_micros(50),
                ))
            } else {
                Box::new(ThrottledSink::new(
                    DiscardSink(order),
                    rates.net,
                    Duration::from_micros(50),
                ))
            }
        };
        let mut sink = mk_sink(SendOrder::InOrder);
        let (serial, su) = run_reads(
            &p,
            src,
            len,
            &ReadConfig::serial(64 * KIB),
            &mut *sink,
            iters,
        );
        let model_serial = len as f64 / rates.disk + len as f64 / rates.net;
        let r = Row {
            len,
            chunk: 0,
            mode: "serial",
            secs: serial,
            serial,
            model: model_serial,
            unover: su,
        };
        print_row(&r);
        rows.push(r);
        for &c in chunks {
            if c > len {
                continue;
            }
            let (secs, u) = run_reads(
                &p,
                src,
                len,
                &ReadConfig::synchronized(c),
                &mut *sink,
                iters,
            );
            let model = len as f64 / rates.disk + c as f64 / rates.net;
            let r = Row {
                len,
                chunk: c,
                mode: "synchro",
                secs,
                serial,
                model,
                unover: u,
            };
            print_row(&r);
            rows.push(r);
        }
    }
    rows
}

/// A sparse file the emulated disk "reads" (no data move).
fn sparse_file(dir: &std::path::Path) -> Source {
    let p = dir.join("sparse");
    std::fs::File::create(&p)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    Source::File(Arc::new(std::fs::File::open(&p).unwrap()))
}

/// The ideal (overhead-free) service time of one READ: chunk ops complete
/// at their streams' token-bucket times, units leave as the order allows,
/// the link sends one unit after another. For one stream this is the
/// closed form l/r_disk + c/r_net (synchronized) or l/r_disk + l/r_net
/// (serial); for a striped source it also covers which members hold data
/// and the in-order wait.
fn ideal(
    src: &Source,
    len: usize,
    chunk: usize,
    serial: bool,
    order: SendOrder,
    disk_per_stream: f64,
    net: f64,
) -> f64 {
    let c = if serial { len } else { chunk };
    let plan = ChunkPlan::new(len as u64, c as u64);
    let mut stream_t = vec![0.0f64; src.streams().max(1)];
    let mut valid = Vec::new();
    let dummy = Arc::new(pool().try_acquire(1).unwrap());
    for r in plan.ranges() {
        let mut t: f64 = 0.0;
        for op in src.ops(OpKind::Read, r.clone(), &dummy, 0, 0) {
            let s = op.stream as usize;
            stream_t[s] += op.len as f64 / disk_per_stream;
            t = t.max(stream_t[s]);
        }
        valid.push(t);
    }
    let units: Vec<std::ops::Range<u64>> =
        ChunkPlan::new(len as u64, chunk as u64).ranges().collect();
    let mut rel: Vec<(f64, u64)> = Vec::new();
    let mut prev: f64 = 0.0;
    for u in &units {
        let mut t: f64 = 0.0;
        for k in plan.chunks_of(u) {
            t = t.max(valid[k]);
        }
        if order == SendOrder::InOrder {
            t = t.max(prev);
            prev = t;
        }
        rel.push((t, u.end - u.start));
    }
    rel.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let mut free: f64 = 0.0;
    for (t, n) in rel {
        free = free.max(t) + n as f64 / net;
    }
    free
}

/// A TCP loopback connection whose far end discards everything.
fn tcp_sink() -> StreamSink<TcpStream> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    });
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    StreamSink(s)
}

/// A TCP sink that takes units in any order (the timing of RDMA
/// placement, DataPDUInOrder=No): the bytes still really cross the socket.
struct AnyOrderTcp(StreamSink<TcpStream>);

impl ChunkSink for AnyOrderTcp {
    fn order(&self) -> SendOrder {
        SendOrder::AnyOrder
    }
    fn send(&mut self, bytes: std::ops::Range<u64>, data: &[u8]) -> std::io::Result<CopyCost> {
        self.0.send(bytes, data)
    }
    fn finish(&mut self) -> std::io::Result<CopyCost> {
        self.0.finish()
    }
}

/// Either kind of sink behind one type (for [`ThrottledSink`]).
struct DynSink(Box<dyn ChunkSink>);

impl ChunkSink for DynSink {
    fn order(&self) -> SendOrder {
        self.0.order()
    }
    fn send(&mut self, bytes: std::ops::Range<u64>, data: &[u8]) -> std::io::Result<CopyCost> {
        self.0.send(bytes, data)
    }
    fn finish(&mut self) -> std::io::Result<CopyCost> {
        self.0.finish()
    }
}

/// Member files of a real striped LUN: made by the striped backstore
/// (O_DIRECT where the filesystem allows), the first 8 MiB written, then
/// opened for the engine. Returns the source and whether it is O_DIRECT.
fn real_striped(dir: &std::path::Path, members: u32) -> (Source, bool) {
    use blockwire_target::backstore::{Backstore, FileMode, StripedBackstore};
    let paths: Vec<_> = (0..members)
        .map(|i| dir.join(format!("real-member{i}")))
        .collect();
    let store = StripedBackstore::open(
        &paths,
        64 * KIB as u64,
        Some(members as u64 * 16 * MIB as u64),
        false,
        FileMode::Direct,
    )
    .unwrap();
    store.write_at(0, &vec![0xa5u8; 8 * MIB]).unwrap();
    store.flush().unwrap();
    store.open_members_for_engine().unwrap()
}

/// The GMBlock paper's Exp. 2b: RAID0 of `members` disks, stripe 64 KiB, aggregate r_disk.
/// With `inner` (a real engine) the member files hold data, every op
/// really moves it (then waits for its member's token bucket), and the
/// sends cross a TCP loopback socket; without, timing only.
#[allow(clippy::too_many_arguments)]
fn striped(
    rates: &Rates,
    sizes: &[usize],
    chunk: usize,
    members: u32,
    iters: usize,
    dir: &std::path::Path,
    inner: Option<Arc<dyn Engine>>,
) {
    let real = inner.is_some();
    println!(
        "\n## Exp. 2b{}: striped backstore, {} members x {:.1} MB/s (aggregate {:.0}), stripe 64K, c = {}, r_net = {:.0} MB/s",
        if real { " (scaled, real I/O)" } else { "" },
        members,
        rates.disk / members as f64 / 1e6,
        rates.disk / 1e6,
        size(chunk),
        rates.net / 1e6
    );
    println!("   single = in-order sends (TCP, DataPDUInOrder=Yes); multi = any order (RDMA, DataPDUInOrder=No)");
    println!(
        "   overlap = share of the network time hidden behind the disk: (T_serial - T) / (l/r_net)"
    );
    let src = if real {
        let (src, direct) = real_striped(dir, members);
        println!(
            "   members written by the striped backstore, read {} through the engine into registered buffers, sent over TCP loopback",
            if direct { "O_DIRECT" } else { "buffered (O_DIRECT refused)" }
        );
        src
    } else {
        let layout = StripeLayout::new(members, 64 * KIB as u64);
        let files = (0..members)
            .map(|i| {
                let p = dir.join(format!("member{i}"));
                std::fs::File::create(&p)
                    .unwrap()
                    .set_len(64 << 20)
                    .unwrap();
                Arc::new(std::fs::File::open(&p).unwrap())
            })
            .collect();
        Source::Striped { files, layout }
    };
    let eng: Arc<dyn Engine> = Arc::new(ThrottledEngine::new(
        pool(),
        members as usize,
        rates.disk / members as f64,
        inner,
    ));
    let p = Pipeline::new(eng);
    println!(
        "{:>6} {:<7} {:>8} {:>8} {:>8} {:>10} {:>18}",
        "l", "mode", "MB/s", "gain", "overlap", "unovl_us", "ideal MB/s (ovl)"
    );
    for &len in sizes {
        let throttle = |s: Box<dyn ChunkSink>| {
            ThrottledSink::new(DynSink(s), rates.net, Duration::from_micros(50))
        };
        let (mut sink_in, mut sink_any) = if real {
            (
                throttle(Box::new(tcp_sink())),
                throttle(Box::new(AnyOrderTcp(tcp_sink()))),
            )
        } else {
            (
                throttle(Box::new(DiscardSink(SendOrder::InOrder))),
                throttle(Box::new(DiscardSink(SendOrder::AnyOrder))),
            )
        };
        let (serial, su) = run_reads(
            &p,
            &src,
            len,
            &ReadConfig::serial(chunk),
            &mut sink_in,
            iters,
        );
        let (single, u1) = run_reads(
            &p,
            &src,
            len,
            &ReadConfig::synchronized(chunk),
            &mut sink_in,
            iters,
        );
        let (multi, u2) = run_reads(
            &p,
            &src,
            len,
            &ReadConfig::synchronized(chunk),
            &mut sink_any,
            iters,
        );
        let tnet = len as f64 / rates.net;
        let per = rates.disk / members as f64;
        let model_serial = ideal(&src, len, chunk, true, SendOrder::InOrder, per, rates.net);
        let model_single = ideal(&src, len, chunk, false, SendOrder::InOrder, per, rates.net);
        let model_multi = ideal(&src, len, chunk, false, SendOrder::AnyOrder, per, rates.net);
        for (mode, t, u, m) in [
            ("serial", serial, su, model_serial),
            ("single", single, u1, model_single),
            ("multi", multi, u2, model_multi),
        ] {
            println!(
                "{:>6} {:<7} {:>8.0} {:>8} {:>7.0}% {:>10.0} {:>18}",
                size(len),
                mode,
                mbps(len, t),
                if mode == "serial" {
                    "-".into()
                } else {
                    format!("{:+.0}%", (serial / t - 1.0) * 100.0)
                },
                (serial - t) / tnet * 100.0,
                u * 1e6,
                format!(
                    "{:.0} ({:.0}%)",
                    mbps(len, m),
                    (model_serial - m) / tnet * 100.0
                ),
            );
        }
    }
}

/// Writes: receive at r_net, write at r_disk; serial vs double buffering.
fn writes(rates: &Rates, sizes: &[usize], chunk: usize, iters: usize) {
    println!(
        "\n## Writes: double buffering (chunk k to disk while k+1 arrives), c = {}, paper rates",
        size(chunk)
    );
    println!("   model: serial l/r_net + l/r_disk; pipelined c/r_net + l/r_disk (disk-bound)");
    let eng: Arc<dyn Engine> = Arc::new(ThrottledEngine::new(pool(), 1, rates.disk, None));
    let p = Pipeline::new(eng);
    let f = tempfile::tempfile().unwrap();
    let dst = Source::File(Arc::new(f));
    println!(
        "{:>6} {:<7} {:>8} {:>8} {:>9} {:>9}",
        "l", "mode", "MB/s", "gain", "model", "vs.model"
    );
    struct Zero;
    impl ChunkProducer for Zero {
        fn fill(&mut self, _: std::ops::Range<u64>, _: &mut [u8]) -> std::io::Result<CopyCost> {
            Ok(CopyCost::default())
        }
    }
    for &len in sizes {
        let mut serial = 0.0;
        for (mode, depth) in [(Mode::Serial, 1), (Mode::Synchronized, 2)] {
            let cfg = WriteConfig { mode, chunk, depth };
            let mut prod = ThrottledProducer::new(Zero, rates.net);
            let mut t = Vec::new();
            for _ in 0..iters + 1 {
                let r = p.write(&dst, 0, len, &cfg, &mut prod).unwrap();
                t.push(r.timers.phase(Phase::Total).as_secs_f64());
            }
            let secs = median(t);
            let model = match mode {
                Mode::Serial => {
                    serial = secs;
                    len as f64 / rates.net + len as f64 / rates.disk
                }
                Mode::Synchronized => chunk as f64 / rates.net + len as f64 / rates.disk,
            };
            println!(
                "{:>6} {:<7} {:>8.0} {:>8} {:>9.0} {:>+8.1}%",
                size(len),
                if mode == Mode::Serial {
                    "serial"
                } else {
                    "double"
                },
                mbps(len, secs),
                if mode == Mode::Serial {
                    "-".into()
                } else {
                    format!("{:+.0}%", (serial / secs - 1.0) * 100.0)
                },
                mbps(len, model),
                (secs / model - 1.0) * 100.0
            );
        }
    }
}

/// The benchmark-only modes (the synchronized-sends paper's gmblock-bogus) on real I/O: no-net gives the disk rate,
/// no-disk the network rate. Returns (disk B/s, net B/s).
fn calibrate(path: &std::path::Path, engine: &Arc<dyn Engine>, iters: usize) -> (f64, f64) {
    let (f, direct) = open_direct_or_buffered(path, false).unwrap();
    let src = Source::File(Arc::new(f));
    let p = Pipeline::new(engine.clone());
    let len = MIB;
    let (disk, _) = run_reads(
        &p,
        &src,
        len,
        &ReadConfig::serial(len),
        &mut DiscardSink(SendOrder::InOrder),
        iters,
    );
    for c in [16 * KIB, 64 * KIB] {
        let (t, _) = run_reads(
            &p,
            &src,
            len,
            &ReadConfig::synchronized(c),
            &mut DiscardSink(SendOrder::InOrder),
            iters,
        );
        println!(
            "   no-net with {} O_DIRECT chunk reads in one batch: {:.0} MB/s",
            size(c),
            mbps(len, t)
        );
    }
    let mut tcp = tcp_sink();
    let (net, _) = run_reads(
        &p,
        &Source::Pattern,
        len,
        &ReadConfig::serial(64 * KIB),
        &mut tcp,
        iters,
    );
    println!(
        "\n## Bogus modes on this machine ({}, {}): no-net (disk only) {:.0} MB/s; no-disk (TCP loopback only) {:.0} MB/s at l = 1M",
        engine.describe(),
        if direct { "O_DIRECT" } else { "buffered: O_DIRECT refused" },
        mbps(len, disk),
        mbps(len, net)
    );
    (mbps(len, disk) * 1e6, mbps(len, net) * 1e6)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let iters: usize = std::env::var("BW_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if full { 24 } else { 2 });
    let paper = Rates {
        name: "Paper rates (GMBlock Exp. 1b, synchronized sends)".into(),
        disk: 335e6,
        net: 462e6,
    };
    let dir = tempfile::tempdir().unwrap();
    if !full {
        // Smoke run for `cargo test --benches`.
        sweep(
            &paper,
            &[256 * KIB],
            &[64 * KIB],
            iters,
            &sparse_file(dir.path()),
            None,
            false,
        );
        striped(&paper, &[512 * KIB], 16 * KIB, 8, iters, dir.path(), None);
        return;
    }
    println!("# blockwire synchronized sends; each point: median of {iters} back-to-back commands, one outstanding");
    let sizes = [64 * KIB, 256 * KIB, MIB, 4 * MIB];
    let chunks = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB];
    let rows = sweep(
        &paper,
        &sizes,
        &chunks,
        iters,
        &sparse_file(dir.path()),
        None,
        false,
    );

    println!(
        "\n## Acceptance: l = 1M, paper rates (criteria: gain >= +44%, within 15% of the model)"
    );
    for r in rows.iter().filter(|r| r.len == MIB && r.mode == "synchro") {
        let gain = (r.serial / r.secs - 1.0) * 100.0;
        let dev = (r.secs / r.model - 1.0) * 100.0;
        println!(
            "   c = {:>4}: {:.0} MB/s vs serial {:.0} MB/s: gain {:+.0}% [{}], model {:.0} MB/s, measured time {:+.1}% vs model [{}]",
            size(r.chunk),
            mbps(r.len, r.secs),
            mbps(r.len, r.serial),
            gain,
            if gain >= 44.0 { "PASS" } else { "FAIL" },
            mbps(r.len, r.model),
            dev,
            if dev.abs() <= 15.0 { "PASS" } else { "FAIL" }
        );
    }

    striped(
        &paper,
        &[256 * KIB, 512 * KIB, MIB, 2 * MIB, 4 * MIB],
        16 * KIB,
        8,
        iters,
        dir.path(),
        None,
    );
    writes(&paper, &[256 * KIB, MIB, 4 * MIB], 64 * KIB, iters);

    // Scaled variant with real data movement.
    let path = dir.path().join("lun");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0xa5u8; MIB];
        for _ in 0..8 {
            f.write_all(&block).unwrap();
        }
        f.sync_all().unwrap();
    }
    let (engine, desc) = open_engine(pool(), EnginePref::Auto).unwrap();
    println!("\nI/O engine: {desc}");
    let (rd, rn) = calibrate(&path, &engine, iters);
    let k = (0.5 * (rd / 335e6).min(rn / 462e6)).max(0.1);
    let scaled = Rates {
        name: format!("Scaled x{k:.2} (half of what this machine sustains)"),
        disk: 335e6 * k,
        net: 462e6 * k,
    };
    let (f, _) = open_direct_or_buffered(&path, false).unwrap();
    let engine_for_stripes = engine.clone();
    sweep(
        &scaled,
        &[256 * KIB, MIB, 4 * MIB],
        &[16 * KIB, 64 * KIB],
        iters,
        &Source::File(Arc::new(f)),
        Some(engine),
        true,
    );
    // Exp. 2b on real I/O: several member streams fill one request.
    striped(
        &scaled,
        &[MIB, 4 * MIB],
        16 * KIB,
        4,
        iters,
        dir.path(),
        Some(engine_for_stripes),
    );
}
