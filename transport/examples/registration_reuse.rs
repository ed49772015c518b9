//! The registration strategies under buffer reuse (the RDMA-assisted iSCSI paper's Fig. 8
//! shape), on any RDMA backend, one run, ratios printed.
//!
//! Each I/O picks an initiator buffer: with probability REUSE one of a hot set as large as
//! the caches (so a cache can hit), otherwise the next of a cold set several times larger
//! (a miss for every cache). The buffer is registered by the strategy, the "target" side
//! RDMA-Writes into it (a SCSI READ) from its pre-registered staging buffer, and the
//! registration is released. Every I/O's data are checked in the initiator's buffer. The
//! baseline is the same loop over buffers registered once up front; each strategy's MB/s
//! is printed as a ratio to it, with the registration counters (registrations,
//! deregistrations, hits, misses, deregistration calls) that explain the ratio.
//!
//! ```text
//! registration_reuse soft  127.0.0.1 [--quick]
//! registration_reuse verbs 10.77.0.1 [rxe0] [--quick]   # --features verbs
//! ```
//! The kernel lab runs the verbs form on Soft-RoCE for function (every strategy registers,
//! invalidates and deregisters real memory regions there, data checked); its timings come
//! from an emulated CPU and are not a measurement.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Instant;

use blockwire_transport::rdma::any::{AnyCq, AnyPd, AnyProvider, AnyQp, Backend};
use blockwire_transport::rdma::*;
use blockwire_transport::reg::*;

const SIZE: usize = 64 << 10;
const HOT: usize = 8;
const COLD: usize = 32;

struct Link {
    cq: AnyCq,
    qp: AnyQp,
    /// The target side's protection domain (staging buffer).
    target_pd: AnyPd,
    /// The initiator side's (the registrations under test).
    initiator_pd: AnyPd,
    _peer: AnyQp,
}

async fn link(p: &AnyProvider, ip: IpAddr) -> Result<Link> {
    let mut l = p.listen(SocketAddr::new(ip, 0)).await?;
    let addr = l.local_addr();
    let initiator_pd = p.alloc_pd()?;
    let init = QpInit::<AnyProvider> {
        pd: initiator_pd.clone(),
        send_cq: p.create_cq(64)?,
        recv_cq: p.create_cq(64)?,
        caps: QpCaps::default(),
    };
    let accept = tokio::spawn(async move { l.accept().await?.accept(init, b"").await });
    let target_pd = p.alloc_pd()?;
    let cq = p.create_cq(64)?;
    let ti = QpInit::<AnyProvider> {
        pd: target_pd.clone(),
        send_cq: cq.clone(),
        recv_cq: p.create_cq(64)?,
        caps: QpCaps::default(),
    };
    let qp = p.connect(addr, ti, b"").await?;
    let peer = accept
        .await
        .map_err(|e| RdmaError::InvalidArgument(e.to_string()))??;
    Ok(Link {
        cq,
        qp,
        target_pd,
        initiator_pd,
        _peer: peer,
    })
}

/// xorshift: the same access sequence for every strategy.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The buffer index of I/O number `i`: hot (0..HOT) with probability `reuse`, else the
/// next cold one.
fn pick(rng: &mut Rng, reuse: f64, cold_next: &mut usize) -> usize {
    if (rng.next() % 1000) as f64 / 1000.0 < reuse {
        (rng.next() % HOT as u64) as usize
    } else {
        *cold_next = (*cold_next + 1) % COLD;
        HOT + *cold_next
    }
}

struct Run {
    mbps: f64,
    bad: usize,
}

/// `iters` RDMA Writes of SIZE bytes into the initiator's buffers, registered by `reg`
/// (None: the pre-registered handles `pre`), each checked.
async fn run(
    l: &Link,
    staging: &impl MemoryRegion,
    bufs: &[(*mut u8, usize)],
    reg: Option<&dyn Registrar>,
    pre: &[RegHandle],
    reuse: f64,
    iters: usize,
) -> Result<Run> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut cold = 0;
    let mut bad = 0;
    let t0 = Instant::now();
    for i in 0..iters {
        let k = pick(&mut rng, reuse, &mut cold);
        let (p, len) = bufs[k];
        let h = match reg {
            // SAFETY: the buffers outlive every registrar (flushed before they drop) and
            // are SIZE bytes each.
            Some(r) => unsafe { r.register(p, len) }?,
            None => pre[k].clone(),
        };
        let stamp = (i as u64).to_le_bytes();
        staging.write_at(0, &stamp)?;
        l.qp.post_send(SendWr {
            wr_id: i as u64,
            op: SendOp::RdmaWrite {
                remote_addr: h.addr,
                rkey: h.rkey,
            },
            sgl: vec![staging.sge(0, SIZE).expect("staging")],
            signaled: true,
        })?;
        let c = l.cq.next().await?;
        if !c.status.is_ok() {
            return Err(RdmaError::InvalidArgument(format!(
                "RDMA Write: {:?}",
                c.status
            )));
        }
        // SAFETY: `p` points at SIZE live bytes that only this loop touches; the
        // completion above means the RDMA Write has landed.
        let head = unsafe { std::slice::from_raw_parts(p, 8) };
        if head != stamp {
            bad += 1;
        }
        if let Some(r) = reg {
            r.release(h)?;
        }
    }
    Ok(Run {
        mbps: (iters * SIZE) as f64 / t0.elapsed().as_secs_f64() / 1e6,
        bad,
    })
}

async fn main_async(
    backend: Backend,
    ip: IpAddr,
    device: Option<&str>,
    quick: bool,
) -> Result<(usize, usize)> {
    let p = AnyProvider::open(backend, device)?;
    let l = link(&p, ip).await?;
    let iters = if quick { 400 } else { 4000 };
    let staging = l
        .target_pd
        .register(AlignedBuf::new(SIZE), AccessFlags::LOCAL_WRITE)?;
    let mem: Vec<AlignedBuf> = (0..HOT + COLD).map(|_| AlignedBuf::new(SIZE)).collect();
    let bufs: Vec<(*mut u8, usize)> = mem.iter().map(|b| (b.as_ptr(), SIZE)).collect();
    println!(
        "{} backend, {} KiB RDMA Writes into {HOT} hot + {COLD} cold initiator buffers, caches of {HOT}, {iters} I/Os per point",
        p.name(),
        SIZE >> 10
    );
    println!(
        "{:>6} {:<15} {:>9} {:>7}  counters (reg/dereg/hit/miss, dereg calls)",
        "reuse", "strategy", "MB/s", "ratio"
    );
    let mut failures = 0;
    let mut passes = 0;
    for reuse in [0.2, 0.8] {
        let pre_mrs = bufs
            .iter()
            // SAFETY: `mem` outlives these regions (dropped after this loop).
            .map(|&(ptr, len)| unsafe { l.initiator_pd.register_raw(ptr, len, AccessFlags::ALL) })
            .collect::<Result<Vec<_>>>()?;
        let pre: Vec<RegHandle> = pre_mrs
            .iter()
            .map(|m| RegHandle::from_parts(m.addr(), m.len(), m.lkey(), m.rkey()))
            .collect();
        let base = run(&l, &staging, &bufs, None, &pre, reuse, iters).await?;
        println!(
            "{:>5.0}% {:<15} {:>9.0} {:>7.2}",
            reuse * 100.0,
            "pre-registered",
            base.mbps,
            1.0
        );
        drop(pre_mrs);
        let strategies: Vec<Box<dyn Registrar>> = vec![
            Box::new(Dynamic::new(l.initiator_pd.clone(), AccessFlags::ALL)),
            Box::new(PinDownCache::new(
                l.initiator_pd.clone(),
                AccessFlags::ALL,
                HOT,
            )),
            Box::new(Fmrd::new(
                l.initiator_pd.clone(),
                AccessFlags::ALL,
                FmrdConfig {
                    capacity: HOT,
                    slots: HOT + COLD,
                    dereg_threshold: 4,
                },
            )?),
        ];
        for r in &strategies {
            let got = run(&l, &staging, &bufs, Some(r.as_ref()), &[], reuse, iters).await?;
            r.flush()?;
            let s = r.stats();
            println!(
                "{:>5.0}% {:<15} {:>9.0} {:>7.2}  {}/{}/{}/{}, {}{}",
                reuse * 100.0,
                r.strategy().name(),
                got.mbps,
                got.mbps / base.mbps,
                s.registrations,
                s.deregistrations,
                s.hits,
                s.misses,
                s.dereg_calls,
                if got.bad > 0 {
                    format!("  FAIL: {} I/Os with wrong data", got.bad)
                } else {
                    String::new()
                }
            );
            failures += got.bad;
            if s.registrations != s.deregistrations {
                println!(
                    "FAIL {}: {} registrations left after flush",
                    r.strategy().name(),
                    s.registrations - s.deregistrations
                );
                failures += 1;
            } else if got.bad == 0 {
                passes += 1;
            }
        }
        // The arena: one registration for all its buffers.
        let arena = Arena::new(&l.initiator_pd, (HOT + COLD) * SIZE, AccessFlags::ALL)?;
        let abufs: Vec<ArenaBuf> = (0..HOT + COLD)
            .map(|_| arena.alloc(SIZE))
            .collect::<Option<_>>()
            .ok_or_else(|| RdmaError::InvalidArgument("arena full".into()))?;
        let aptrs: Vec<(*mut u8, usize)> = abufs.iter().map(|b| (b.as_ptr(), SIZE)).collect();
        let got = run(&l, &staging, &aptrs, Some(&arena), &[], reuse, iters).await?;
        println!(
            "{:>5.0}% {:<15} {:>9.0} {:>7.2}{}",
            reuse * 100.0,
            arena.strategy().name(),
            got.mbps,
            got.mbps / base.mbps,
            if got.bad > 0 {
                format!("  FAIL: {} I/Os with wrong data", got.bad)
            } else {
                String::new()
            }
        );
        failures += got.bad;
        if got.bad == 0 {
            passes += 1;
        }
        for b in abufs {
            arena.free(b);
        }
    }
    drop(mem);
    println!("ratio: MB/s over the pre-registered baseline of the same reuse (1.00 = no registration cost)");
    Ok((passes, failures))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--quick")
        .collect();
    let quick = std::env::args().any(|a| a == "--quick");
    let backend = args.first().and_then(|b| Backend::parse(b));
    let ip = args.get(1).and_then(|a| a.parse::<IpAddr>().ok());
    let (Some(backend), Some(ip)) = (backend, ip) else {
        eprintln!("usage: registration_reuse soft|verbs ADDR [DEVICE] [--quick]");
        return ExitCode::from(2);
    };
    blockwire_transport::rdma::soft::raise_memlock_limit(1 << 30);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match rt.block_on(main_async(
        backend,
        ip,
        args.get(2).map(String::as_str),
        quick,
    )) {
        Ok((passed, 0)) => {
            println!("PASS every strategy at 20% and 80% reuse moved checked data, registrations balanced");
            println!("registration-reuse: {passed} passed, 0 failed");
            ExitCode::SUCCESS
        }
        Ok((passed, failed)) => {
            println!("registration-reuse: {passed} passed, {failed} failed");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("FAIL registration-reuse: {e}");
            ExitCode::FAILURE
        }
    }
}
