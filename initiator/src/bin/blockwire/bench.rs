//! `blockwire bench`: random or sequential READs or WRITEs at a queue depth against
//! one LUN, printing IOPS, bandwidth and latency percentiles.

use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) async fn bench(
    cli: &Cli,
    s: &SessionArgs,
    lun: u16,
    pattern: Pattern,
    op: Op,
    bs: u64,
    qd: usize,
    time: Duration,
    span: Option<u64>,
) -> Result<()> {
    let sess = Arc::new(open_lun(cli, s, qd, 0).await?);
    let cap = sess.read_capacity(lun).await?;
    let block = u64::from(cap.block_size);
    if bs == 0 || bs % block != 0 {
        bail!("--bs {bs} must be a multiple of the LUN's block size {block}");
    }
    let span_blocks = span.map_or(cap.blocks, |s| (s / block).min(cap.blocks));
    let per_io = bs / block;
    if span_blocks < per_io {
        bail!("the LUN ({} blocks) is smaller than one I/O", span_blocks);
    }
    let slots = span_blocks / per_io;
    println!(
        "bench: {} {} bs={} qd={} time={:?} target={} lun={} span={} data-path={}",
        match pattern {
            Pattern::Rand => "random",
            Pattern::Seq => "sequential",
        },
        match op {
            Op::Read => "read",
            Op::Write => "write",
        },
        bs,
        qd,
        time,
        sess.target(),
        lun,
        human(slots * bs),
        sess.describe()
    );
    let start = Instant::now();
    let deadline = start + time;
    let mut workers = Vec::new();
    for w in 0..qd {
        let sess = sess.clone();
        workers.push(tokio::spawn(async move {
            let mut lat: Vec<u32> = Vec::new();
            let mut rng = rand::rngs::StdRng::from_entropy();
            let mut buf = vec![0u8; bs as usize];
            if op == Op::Write {
                rng.fill(&mut buf[..]);
            }
            let mut next = w as u64;
            while Instant::now() < deadline {
                let slot = match pattern {
                    Pattern::Rand => rng.gen_range(0..slots),
                    Pattern::Seq => {
                        let s = next % slots;
                        next += qd as u64;
                        s
                    }
                };
                let lba = slot * per_io;
                let t = Instant::now();
                match op {
                    Op::Read => {
                        if buf.len() != bs as usize {
                            buf.resize(bs as usize, 0);
                        }
                        sess.read(lun, lba, per_io as u32, &mut buf).await?
                    }
                    Op::Write => sess.write(lun, lba, per_io as u32, &buf).await?,
                };
                lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.context("bench worker panicked")??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let n = all.len() as f64;
    let pct = |p: f64| -> f64 {
        if all.is_empty() {
            return 0.0;
        }
        let i = ((p / 100.0) * (n - 1.0)).round() as usize;
        f64::from(all[i.min(all.len() - 1)])
    };
    let mean = if all.is_empty() {
        0.0
    } else {
        all.iter().map(|&x| f64::from(x)).sum::<f64>() / n
    };
    let bytes = n * bs as f64;
    println!("ios={} elapsed={:.2}s", all.len(), elapsed);
    println!(
        "IOPS={:.0}  MB/s={:.1}  MiB/s={:.1}",
        n / elapsed,
        bytes / elapsed / 1e6,
        bytes / elapsed / (1 << 20) as f64
    );
    println!(
        "latency usec: mean={:.0} p50={:.0} p90={:.0} p99={:.0} p99.9={:.0} max={:.0}",
        mean,
        pct(50.0),
        pct(90.0),
        pct(99.0),
        pct(99.9),
        all.last().copied().unwrap_or(0)
    );
    if let Ok(s) = Arc::try_unwrap(sess) {
        let _ = s.logout().await;
    }
    Ok(())
}
