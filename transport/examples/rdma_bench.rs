//! Registration strategies over the soft RDMA provider, one run, ratios printed.
//!
//! For each transfer size (4 KiB .. 4 MiB) and each strategy (dynamic, pin-down cache,
//! FMRD, arena) the "initiator" side registers one of its buffers per I/O (random choice
//! among N distinct buffers, cache capacity N/2, so caches hit about half the time), the
//! "target" side moves the data by RDMA WRITE (SCSI READ) or RDMA READ (SCSI WRITE) from
//! its pre-registered staging buffer, and the initiator releases the registration. The
//! baseline is the same loop over buffers registered once up front.
//!
//! Run: cargo run --release -p blockwire-transport --example rdma_bench [-- --quick]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::time::{Duration, Instant};

use blockwire_transport::rdma::soft::{self, SoftCq, SoftPd, SoftProvider, SoftQp};
use blockwire_transport::rdma::*;
use blockwire_transport::reg::*;

const SIZES: [usize; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

struct Link {
    a_cq: SoftCq,
    a_qp: SoftQp,
    a_pd: SoftPd,
    b_pd: SoftPd,
    _b_qp: SoftQp,
}

/// a: the side that issues RDMA operations; b: the buffer owner, which stays passive.
async fn link(p: &SoftProvider) -> Link {
    let (a, b) = conformance::pair(p, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("a soft RDMA connection over loopback");
    Link {
        a_pd: a.pd,
        a_cq: a.cq,
        a_qp: a.qp,
        b_pd: b.pd,
        _b_qp: b.qp,
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[derive(Clone, Copy, Default)]
struct Point {
    mbps: f64,
    reg_us: f64,
}

/// The I/O loop. `reg` = None: pre-registered baseline (`pre` holds the handles).
async fn io_loop(
    link: &Link,
    staging: &impl MemoryRegion,
    bufs: &[(*mut u8, usize)],
    reg: Option<&dyn Registrar>,
    pre: &[RegHandle],
    iters: usize,
    write: bool,
) -> Point {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut reg_time = Duration::ZERO;
    let size = bufs[0].1;
    let t0 = Instant::now();
    for i in 0..iters {
        let k = (rng.next() % bufs.len() as u64) as usize;
        let (p, len) = bufs[k];
        let h = match reg {
            Some(r) => {
                let t = Instant::now();
                // SAFETY: the buffers outlive the registrar (flushed before they drop).
                let h = unsafe { r.register(p, len) }.expect("register");
                reg_time += t.elapsed();
                h
            }
            None => pre[k].clone(),
        };
        let op = if write {
            SendOp::RdmaWrite {
                remote_addr: h.addr,
                rkey: h.rkey,
            }
        } else {
            SendOp::RdmaRead {
                remote_addr: h.addr,
                rkey: h.rkey,
            }
        };
        link.a_qp
            .post_send(SendWr {
                wr_id: i as u64,
                op,
                sgl: vec![staging.sge(0, size).unwrap()],
                signaled: true,
            })
            .unwrap();
        let c = link.a_cq.next().await.unwrap();
        assert!(c.status.is_ok(), "{c:?}");
        if let Some(r) = reg {
            let t = Instant::now();
            r.release(h).unwrap();
            reg_time += t.elapsed();
        }
    }
    let el = t0.elapsed().as_secs_f64();
    Point {
        mbps: (iters * size) as f64 / el / 1e6,
        reg_us: reg_time.as_secs_f64() * 1e6 / iters as f64,
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let limit = soft::raise_memlock_limit(1 << 30);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let p = SoftProvider::default();
        let l = link(&p).await;
        println!(
            "soft RDMA over TCP 127.0.0.1, RLIMIT_MEMLOCK = {} (pinning {})",
            limit.map_or("unknown".into(), |b| if b == u64::MAX { "unlimited".into() } else { format!("{} KiB", b >> 10) }),
            "with mlock, refcounted per page"
        );
        println!("N distinct initiator buffers per size, random access, caches hold N/2 (≈50% hits)\n");
        println!(
            "{:>7} {:>3} {:<15} {:>9} {:>9} {:>10} {:>10} {:>7} {:>7}  counters (reg/dereg/hit/miss, dereg calls)",
            "size", "N", "strategy", "reg µs", "cold µs", "WRITE MB/s", "READ MB/s", "W ratio", "R ratio"
        );
        for &size in &SIZES {
            let n = ((64 << 20) / size).clamp(4, 32);
            let bytes_per_point: usize = if quick { 8 << 20 } else { 64 << 20 };
            let iters = (bytes_per_point / size).clamp(16, 4000);
            let staging = l.a_pd.register(AlignedBuf::new(size), AccessFlags::LOCAL_WRITE).unwrap();
            let mem: Vec<AlignedBuf> = (0..n).map(|_| AlignedBuf::new(size)).collect();
            let bufs: Vec<(*mut u8, usize)> = mem.iter().map(|b| (b.as_ptr(), size)).collect();

            // Baseline: registered once.
            let pre_mrs: Vec<_> = bufs
                .iter()
                // SAFETY: `mem` outlives these regions (dropped at the end of the size).
                .map(|&(p, len)| unsafe { l.b_pd.register_raw(p, len, AccessFlags::ALL) }.unwrap())
                .collect();
            let pre: Vec<RegHandle> = pre_mrs
                .iter()
                .map(|m| RegHandle::from_parts(m.addr(), m.len(), m.lkey(), m.rkey()))
                .collect();
            let bw = io_loop(&l, &staging, &bufs, None, &pre, iters, true).await;
            let br = io_loop(&l, &staging, &bufs, None, &pre, iters, false).await;
            println!(
                "{:>7} {:>3} {:<15} {:>9} {:>9} {:>10.0} {:>10.0} {:>7.2} {:>7.2}",
                human(size), n, "pre-registered", "-", "-", bw.mbps, br.mbps, 1.0, 1.0
            );
            drop(pre_mrs);

            let half = (n / 2).max(1);
            let arena = Arena::new(&l.b_pd, n * size, AccessFlags::ALL).unwrap();
            let abufs: Vec<ArenaBuf> = (0..n).map(|_| arena.alloc(size).unwrap()).collect();
            let aptrs: Vec<(*mut u8, usize)> = abufs.iter().map(|b| (b.as_ptr(), size)).collect();
            let regs: Vec<(Box<dyn Registrar>, &[(*mut u8, usize)])> = vec![
                (Box::new(Dynamic::new(l.b_pd.clone(), AccessFlags::ALL)), &bufs),
                (Box::new(PinDownCache::new(l.b_pd.clone(), AccessFlags::ALL, half)), &bufs),
                (
                    Box::new(
                        Fmrd::new(
                            l.b_pd.clone(),
                            AccessFlags::ALL,
                            FmrdConfig { capacity: half, slots: n, dereg_threshold: (half / 4).max(2) },
                        )
                        .unwrap(),
                    ),
                    &bufs,
                ),
                (Box::new(ArenaRef(&arena)), &aptrs),
            ];
            for (r, b) in &regs {
                let cold = cold_cost(r.as_ref(), b);
                let w = io_loop(&l, &staging, b, Some(r.as_ref()), &[], iters, true).await;
                let rd = io_loop(&l, &staging, b, Some(r.as_ref()), &[], iters, false).await;
                r.flush().unwrap();
                let s = r.stats();
                println!(
                    "{:>7} {:>3} {:<15} {:>9.2} {:>9.2} {:>10.0} {:>10.0} {:>7.2} {:>7.2}  {}/{}/{}/{}, {}",
                    human(size), n, r.strategy().name(), (w.reg_us + rd.reg_us) / 2.0, cold, w.mbps, rd.mbps,
                    w.mbps / bw.mbps, rd.mbps / br.mbps,
                    s.registrations, s.deregistrations, s.hits, s.misses, s.dereg_calls
                );
            }
            drop(regs);
            for b in abufs {
                arena.free(b);
            }
            drop(mem);
            println!();
        }
        println!(
            "reg µs: registration + release per I/O in the loop; cold µs: register + release of a \
             buffer not in any cache (first touch excluded)"
        );
        println!("device: {} pages still pinned, {} pin failures", soft::pinned_pages(&p), p.counters().pin_failures.load(std::sync::atomic::Ordering::Relaxed));
    });
}

/// Average cost of register+release of a buffer the strategy has not seen (cold miss).
fn cold_cost(r: &dyn Registrar, bufs: &[(*mut u8, usize)]) -> f64 {
    // Touch the pages first so page faults are not counted.
    let reps = bufs.len().min(8);
    let t = Instant::now();
    for &(p, len) in bufs.iter().rev().take(reps) {
        // SAFETY: as in io_loop.
        let h = unsafe { r.register(p, len) }.unwrap();
        r.release(h).unwrap();
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
    r.flush().unwrap();
    us
}

/// Borrowing wrapper so the arena can sit in the same list as the owned strategies.
struct ArenaRef<'a>(&'a Arena<SoftPd>);
impl Registrar for ArenaRef<'_> {
    fn strategy(&self) -> Strategy {
        self.0.strategy()
    }
    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<RegHandle> {
        // SAFETY: forwarded.
        unsafe { self.0.register(addr, len) }
    }
    fn release(&self, h: RegHandle) -> Result<()> {
        self.0.release(h)
    }
    fn flush(&self) -> Result<()> {
        self.0.flush()
    }
    fn stats(&self) -> RegStats {
        self.0.stats()
    }
}

fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{}MiB", n >> 20)
    } else {
        format!("{}KiB", n >> 10)
    }
}
