//! `blockwire dd`: copies between local files and LUNs (`iscsi://` URLs), many
//! blocks in flight, dd's operands.

use super::*;

/// One end of a copy.
enum End {
    File(Arc<std::fs::File>, u64),
    Lun(Arc<data_path::LunSession>, u16, u32, u64),
}

impl End {
    fn len(&self) -> u64 {
        match self {
            End::File(_, n) => *n,
            End::Lun(_, _, _, n) => *n,
        }
    }

    fn block(&self) -> u64 {
        match self {
            End::File(..) => 1,
            End::Lun(_, _, b, _) => u64::from(*b),
        }
    }

    async fn read(&self, at: u64, buf: &mut Vec<u8>) -> Result<()> {
        match self {
            End::File(f, _) => {
                use std::os::unix::fs::FileExt;
                f.read_exact_at(buf, at).context("reading the input file")
            }
            End::Lun(s, lun, b, _) => {
                let blocks = (buf.len() as u64 / u64::from(*b)) as u32;
                s.read(*lun, at / u64::from(*b), blocks, buf).await?;
                Ok(())
            }
        }
    }

    async fn write(&self, at: u64, buf: &[u8]) -> Result<()> {
        match self {
            End::File(f, _) => {
                use std::os::unix::fs::FileExt;
                f.write_all_at(buf, at).context("writing the output file")
            }
            End::Lun(s, lun, b, _) => {
                let blocks = (buf.len() as u64 / u64::from(*b)) as u32;
                s.write(*lun, at / u64::from(*b), blocks, buf).await?;
                Ok(())
            }
        }
    }
}

/// `iscsi://[USER%SECRET@]HOST[:PORT]/IQN/LUN` -> (user, secret, portal, iqn, lun).
fn parse_url(url: &str) -> Result<(Option<(String, String)>, String, String, u16)> {
    let rest = url
        .strip_prefix("iscsi://")
        .ok_or_else(|| anyhow!("`{url}` is not an iscsi:// URL"))?;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((a, r)) => {
            let (u, p) = a
                .split_once('%')
                .ok_or_else(|| anyhow!("`{url}`: credentials are USER%SECRET@"))?;
            (Some((u.to_owned(), p.to_owned())), r)
        }
        None => (None, rest),
    };
    let mut parts = rest.splitn(3, '/');
    let portal = parts.next().unwrap_or_default().to_owned();
    let iqn = parts
        .next()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| anyhow!("`{url}`: missing /IQN/LUN"))?
        .to_owned();
    let lun = parts
        .next()
        .unwrap_or("0")
        .trim_end_matches('/')
        .parse()
        .with_context(|| format!("`{url}`: the LUN must be a number"))?;
    Ok((auth, portal, iqn, lun))
}

async fn open_end(cli: &Cli, spec: &str, write: bool, qd: usize) -> Result<End> {
    if spec.starts_with("iscsi://") {
        let (auth, portal, iqn, lun) = parse_url(spec)?;
        let a = AuthArgs {
            chap_user: auth.as_ref().map(|a| a.0.clone()),
            chap_secret: auth.map(|a| a.1),
            ..AuthArgs::default()
        };
        let s = SessionArgs {
            portal,
            target: Some(iqn),
            auth: a,
            header_digest: false,
            data_digest: false,
        };
        // Input and output may be LUNs of one target: each end logs in as
        // a session of its own (its own ISID), or one would end the other.
        let sess = open_lun(cli, &s, qd, u16::from(write)).await?;
        let cap = sess.read_capacity(lun).await?;
        return Ok(End::Lun(Arc::new(sess), lun, cap.block_size, cap.bytes()));
    }
    let f = if write {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(spec)
    } else {
        std::fs::File::open(spec)
    }
    .with_context(|| format!("opening {spec}"))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    Ok(End::File(Arc::new(f), if write { u64::MAX } else { len }))
}

/// What dd copies: `count` blocks of `bs` bytes (default: as many as fit),
/// from block `skip` of the input to block `seek` of the output.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) bs: u64,
    pub(super) count: Option<u64>,
    pub(super) skip: u64,
    pub(super) seek: u64,
}

pub(super) async fn dd(
    cli: &Cli,
    input: &str,
    output: &str,
    span: Span,
    qd: usize,
    quiet: bool,
) -> Result<()> {
    let Span {
        bs,
        count,
        skip,
        seek,
    } = span;
    let src = Arc::new(open_end(cli, input, false, qd).await?);
    let dst = Arc::new(open_end(cli, output, true, qd).await?);
    let align = src.block().max(dst.block());
    if bs == 0 || bs % align != 0 {
        bail!("--bs {bs} must be a multiple of the block size {align}");
    }
    let (from, to) = (
        skip.checked_mul(bs)
            .ok_or_else(|| anyhow!("skip={skip} x bs={bs} overflows"))?,
        seek.checked_mul(bs)
            .ok_or_else(|| anyhow!("seek={seek} x bs={bs} overflows"))?,
    );
    if from > src.len() {
        bail!(
            "skip={skip} (byte {from}) is past the end of {input} ({} bytes)",
            src.len()
        );
    }
    if to > dst.len() {
        bail!(
            "seek={seek} (byte {to}) is past the end of {output} ({} bytes)",
            dst.len()
        );
    }
    let mut total = (src.len() - from).min(dst.len() - to);
    if let Some(c) = count {
        total = total.min(c.saturating_mul(bs));
    }
    if total % align != 0 {
        bail!("{total} bytes to copy is not a multiple of the block size {align}");
    }
    let chunks = total.div_ceil(bs);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..qd {
        let (src, dst, next, done) = (src.clone(), dst.clone(), next.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut buf = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= chunks {
                    return Ok::<_, anyhow::Error>(());
                }
                let at = i * bs;
                let n = bs.min(total - at) as usize;
                buf.resize(n, 0);
                src.read(from + at, &mut buf).await?;
                dst.write(to + at, &buf).await?;
                done.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    let progress = (!quiet).then(|| {
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let d = done.load(std::sync::atomic::Ordering::Relaxed);
                let secs = start.elapsed().as_secs_f64().max(1e-6);
                let pct = if total == 0 {
                    100.0
                } else {
                    d as f64 * 100.0 / total as f64
                };
                let width = 30;
                let filled = ((pct / 100.0) * width as f64) as usize;
                eprint!(
                    "\r[{}{}] {pct:5.1}% {} / {}  {:.1} MB/s ",
                    "#".repeat(filled),
                    "-".repeat(width - filled),
                    human(d),
                    human(total),
                    d as f64 / secs / 1e6
                );
            }
        })
    });
    let mut result = Ok(());
    for w in workers {
        if let Err(e) = w.await.context("copy worker panicked")? {
            result = Err(e);
        }
    }
    if let Some(p) = progress {
        p.abort();
        eprintln!();
    }
    result?;
    // What the output LUN acknowledged is on its medium only after a
    // SYNCHRONIZE CACHE (SBC-4 5.24): one that fails fails the copy.
    if let End::Lun(s, lun, ..) = &*dst {
        s.synchronize_cache(*lun)
            .await
            .with_context(|| format!("the final SYNCHRONIZE CACHE of LUN {lun}"))?;
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "{total} bytes ({}) copied, {secs:.3} s, {:.1} MB/s",
        human(total),
        total as f64 / secs.max(1e-9) / 1e6
    );
    for end in [src, dst] {
        if let Ok(End::Lun(s, ..)) = Arc::try_unwrap(end) {
            if let Ok(s) = Arc::try_unwrap(s) {
                let _ = s.logout().await;
            }
        }
    }
    Ok(())
}
