//! `blockwire ublk`: a LUN as a Linux block device (`/dev/ublkbN`) through
//! the kernel's ublk driver (user-space block devices, Linux 6.0+), with the
//! `libublk` crate. Built only with the cargo feature `ublk`.
//!
//! Each ublk queue runs on its own thread (libublk's io_uring loop with a
//! smol executor, one task per tag). A tag's task hands its request to the
//! tokio runtime, where the session runs it (READ(16), WRITE(16) with FUA
//! when the block layer asks for it, SYNCHRONIZE CACHE for a flush), and
//! commits the result back to the driver. The device advertises a volatile
//! write cache and FUA, so the kernel sends flushes and FUA writes through.
//!
//! Where the kernel has no ublk driver (`/dev/ublk-control` missing) it
//! fails at once with a message saying so; `blockwire mount` + `losetup`
//! is the fallback that works with FUSE alone.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use blockwire_initiator::{rw16, Capacity, Session};
use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkQueue};
use libublk::{sys, BufDesc, UblkError, UblkFlags};
use tokio::runtime::Handle;

/// The ublk driver's control device.
pub const UBLK_CONTROL: &str = "/dev/ublk-control";

/// Fails with a clear message when this kernel cannot create ublk devices.
pub fn check_available() -> Result<()> {
    let p = Path::new(UBLK_CONTROL);
    if !p.exists() {
        let module = if Path::new("/sys/module/ublk_drv").exists() {
            "the ublk_drv module is loaded but the device node is missing (udev?)"
        } else {
            "this kernel has no ublk driver loaded (CONFIG_BLK_DEV_UBLK; try `modprobe ublk_drv`)"
        };
        bail!(
            "ublk is not available: {UBLK_CONTROL} is missing — {module}. \
             Use `blockwire mount DIR` and `losetup -f --show DIR/lun0` instead"
        );
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .with_context(|| format!("ublk is not available: cannot open {UBLK_CONTROL}"))?;
    Ok(())
}

/// libublk sends control commands (start, stop, delete the device) through
/// an io_uring that belongs to the calling thread, set up only on the thread
/// that built the `UblkCtrl`. Every other thread that touches the device
/// (the queue runner, the signal handler) sets up its own first.
fn ensure_ctrl_ring() -> Result<(), UblkError> {
    libublk::ublk_init_ctrl_task_ring(|ring| {
        if ring.is_none() {
            let r = io_uring::IoUring::<io_uring::squeue::Entry128>::builder()
                .build(16)
                .map_err(UblkError::IOError)?;
            *ring = Some(r);
        }
        Ok(())
    })
}

/// What one I/O command asks for.
enum Op {
    Read {
        lba: u64,
        blocks: u32,
        bytes: usize,
    },
    Write {
        lba: u64,
        blocks: u32,
        data: Vec<u8>,
        fua: bool,
    },
    Flush,
}

/// How a tag's task learns that the tokio side finished its command. The
/// queue thread sleeps in its io_uring (libublk's event loop) and only wakes
/// for completions there, so a channel alone would leave the answer sitting
/// until the loop's idle timeout. Each tag owns a pipe: the task posts an
/// io_uring read on it, the tokio side sends the result and then writes one
/// byte, and the read's completion wakes the task on the queue thread.
struct Doorbell {
    reader: std::io::PipeReader,
    writer: Arc<std::io::PipeWriter>,
}

impl Doorbell {
    fn new() -> std::io::Result<Doorbell> {
        let (reader, writer) = std::io::pipe()?;
        Ok(Doorbell {
            reader,
            writer: Arc::new(writer),
        })
    }

    /// Waits (on the queue's io_uring) for one ring of the bell.
    async fn wait(&self) -> Result<(), UblkError> {
        use std::os::fd::AsRawFd;
        let mut byte = [0u8; 1];
        let sqe = io_uring::opcode::Read::new(
            io_uring::types::Fd(self.reader.as_raw_fd()),
            byte.as_mut_ptr(),
            1,
        )
        .build();
        // `byte` lives until the read completes: this future awaits it.
        let r =
            libublk::uring_async::ublk_submit_sqe_async(sqe, libublk::UblkUringData::Target as u64)
                .await?;
        if r == 1 {
            Ok(())
        } else {
            Err(UblkError::OtherError(if r < 0 { r } else { -libc::EIO }))
        }
    }
}

/// Runs `op` on the tokio runtime and waits for it from the queue's
/// executor; returns the bytes for a READ and the ublk result (bytes
/// moved, or -errno).
async fn run_op(
    rt: &Handle,
    bell: &Doorbell,
    s: &Arc<Session>,
    lun: u16,
    op: Op,
) -> (Option<Vec<u8>>, i32) {
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let s = s.clone();
    let writer = bell.writer.clone();
    rt.spawn(async move {
        let r = match op {
            Op::Read { lba, blocks, bytes } => {
                let mut buf = vec![0u8; bytes];
                match s.read(lun, lba, blocks, &mut buf).await {
                    Ok(_) => (Some(buf), bytes as i32),
                    Err(e) => {
                        eprintln!("blockwire ublk: READ lba {lba} x{blocks}: {e}");
                        (None, -e.errno())
                    }
                }
            }
            Op::Write {
                lba,
                blocks,
                data,
                fua,
            } => {
                let cdb = rw16(true, lba, blocks, fua);
                match s.write_blocks(lun, &cdb, &data).await {
                    Ok(_) => (None, data.len() as i32),
                    Err(e) => {
                        eprintln!("blockwire ublk: WRITE lba {lba} x{blocks}: {e}");
                        (None, -e.errno())
                    }
                }
            }
            Op::Flush => match s.synchronize_cache(lun).await {
                Ok(()) => (None, 0),
                Err(e) => {
                    eprintln!("blockwire ublk: SYNCHRONIZE CACHE: {e}");
                    (None, -e.errno())
                }
            },
        };
        let _ = tx.send(r);
        // Ring after the result is in the channel: the woken task finds it.
        let _ = std::io::Write::write_all(&mut &*writer, &[1]);
    });
    if let Err(e) = bell.wait().await {
        eprintln!("blockwire ublk: waiting for a command: {e}");
        return (None, -libc::EIO);
    }
    rx.try_recv().unwrap_or((None, -libc::EIO))
}

/// Makes room for the descriptors a queue of `depth` tags holds: each tag
/// a pipe (two) as its doorbell, beside the session's, the ublk device's
/// and the runtime's. A tag that cannot make its pipe never fetches, and
/// the kernel's START_DEV waits for every tag: past the open-files limit
/// the command hung, and its device stayed behind. The soft limit is
/// raised as far as the hard one allows; past that the depth is refused.
pub fn open_files_for(depth: u16) -> Result<()> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let need = 2 * u64::from(depth.max(1)) + 64;
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|soft| soft >= need) {
        return Ok(());
    }
    let hard = limit.maximum;
    if hard.is_some_and(|h| h < need) {
        bail!(
            "--qd {depth} needs about {need} open files, and this process may open at most {} \
             (ulimit -Hn): lower --qd, or raise the limit",
            hard.unwrap_or_default()
        );
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(need),
            maximum: hard,
        },
    )
    .with_context(|| format!("raising the open-files limit to {need} for --qd {depth}"))
}

/// One tag's loop: fetch a request, run it, commit the result.
async fn io_task(
    q: &UblkQueue<'_>,
    tag: u16,
    rt: Handle,
    s: Arc<Session>,
    lun: u16,
    block_size: u32,
) -> Result<(), UblkError> {
    let bell = Doorbell::new().map_err(UblkError::IOError)?;
    let mut buf = IoBuf::<u8>::new(q.dev.dev_info.max_io_buf_bytes as usize);
    q.submit_io_prep_cmd(tag, BufDesc::Slice(buf.as_slice()), 0, Some(&buf))
        .await?;
    let bs = u64::from(block_size);
    loop {
        let iod = q.get_iod(tag);
        let op = iod.op_flags & 0xff;
        let fua = iod.op_flags & sys::UBLK_IO_F_FUA != 0;
        let off = iod.start_sector << 9;
        let bytes = (u64::from(iod.nr_sectors) << 9) as usize;
        let aligned = off % bs == 0 && bytes as u64 % bs == 0 && bytes <= buf.as_slice().len();
        let lba = off / bs;
        let blocks = (bytes as u64 / bs) as u32;
        let res = match op {
            _ if !aligned && (op == sys::UBLK_IO_OP_READ || op == sys::UBLK_IO_OP_WRITE) => {
                -libc::EINVAL
            }
            sys::UBLK_IO_OP_READ => {
                let (data, r) = run_op(&rt, &bell, &s, lun, Op::Read { lba, blocks, bytes }).await;
                if let Some(d) = data {
                    buf.as_mut_slice()[..bytes].copy_from_slice(&d);
                }
                r
            }
            sys::UBLK_IO_OP_WRITE => {
                let data = buf.as_slice()[..bytes].to_vec();
                let w = Op::Write {
                    lba,
                    blocks,
                    data,
                    fua,
                };
                run_op(&rt, &bell, &s, lun, w).await.1
            }
            sys::UBLK_IO_OP_FLUSH => run_op(&rt, &bell, &s, lun, Op::Flush).await.1,
            _ => -libc::EOPNOTSUPP,
        };
        q.submit_io_commit_cmd(tag, BufDesc::Slice(buf.as_slice()), res)
            .await?;
    }
}

/// Serves LUN `lun` of `session` as /dev/ublkbN until SIGINT/SIGTERM (which
/// deletes the device), then SYNCHRONIZE CACHE and logout.
pub async fn serve(session: Session, lun: u16, depth: u16) -> Result<()> {
    check_available()?;
    let cap: Capacity = session
        .read_capacity(lun)
        .await
        .with_context(|| format!("READ CAPACITY of LUN {lun}"))?;
    if !cap.block_size.is_power_of_two() || !(512..=4096).contains(&cap.block_size) {
        bail!(
            "LUN {lun} has {}-byte blocks; ublk takes 512..4096, powers of two",
            cap.block_size
        );
    }
    // The kernel cuts requests to the device's max_sectors: no longer than
    // the unit's MAXIMUM TRANSFER LENGTH, which it would refuse past.
    let max_sectors = session
        .max_transfer_blocks(lun)
        .await
        .with_context(|| format!("Block Limits VPD page of LUN {lun}"))?
        .map(|m| sectors_of(m.get(), cap.block_size));
    // A device that says it takes FUA gets REQ_FUA writes with no flush
    // after them: only a unit that takes the bit (DPOFUA) may say so; for
    // the others the kernel follows each such write with a flush.
    let takes_fua = session.takes_fua(lun).await;
    if !takes_fua {
        eprintln!(
            "blockwire ublk: LUN {lun} does not take FUA (DPOFUA=0): the kernel flushes after \
             each FUA write instead"
        );
    }
    // The kernel takes no device whose requests may not span a page (it
    // refuses the limits, or raises them past what the unit takes).
    let page_sectors = (page_size() / 512) as u32;
    if let Some(m) = max_sectors.filter(|&m| m < page_sectors) {
        bail!(
            "LUN {lun} takes at most {} bytes per READ or WRITE (its MAXIMUM TRANSFER LENGTH), \
             less than a {}-byte page, the least a ublk device's request may span; \
             use `blockwire mount`, which cuts requests to that length",
            u64::from(m) * 512,
            page_size()
        );
    }
    let session = Arc::new(session);
    let resizes =
        crate::capacity_watch::spawn(Arc::downgrade(&session), "ublk", session.capacity_changes());
    let ctrl = Arc::new(
        libublk::ctrl::UblkCtrlBuilder::default()
            .name("blockwire")
            .id(-1)
            .nr_queues(1)
            .depth(depth.max(1))
            .io_buf_bytes(1 << 20)
            .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
            .build()
            .map_err(|e| anyhow::anyhow!("creating the ublk device: {e}"))?,
    );

    // SIGINT/SIGTERM: stop the device; the queue threads then end.
    let killer = ctrl.clone();
    let signals = tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        // Stopping the device waits for the requests in flight (and writes
        // the page cache back), whose commands need this runtime's workers:
        // so on a blocking thread, never on a worker, which with one worker
        // would wait for itself. The control ring is per thread: set up
        // there too.
        let stopped = tokio::task::spawn_blocking(move || {
            ensure_ctrl_ring()?;
            killer.kill_dev().map(drop)
        })
        .await;
        match stopped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("blockwire ublk: cannot stop the device: {e}"),
            Err(e) => eprintln!("blockwire ublk: cannot stop the device: {e}"),
        }
    });

    let rt = Handle::current();
    let s = session.clone();
    let size = cap.bytes();
    let shift = cap.block_size.trailing_zeros() as u8;
    let target = session.target().to_owned();
    let runner = ctrl.clone();
    tokio::task::spawn_blocking(move || {
        ensure_ctrl_ring()?;
        let r = runner.run_target(
            move |dev: &mut UblkDev| {
                dev.set_default_params(size);
                let p = &mut dev.tgt.params.basic;
                p.attrs = sys::UBLK_ATTR_VOLATILE_CACHE;
                if takes_fua {
                    p.attrs |= sys::UBLK_ATTR_FUA;
                }
                p.logical_bs_shift = shift;
                p.physical_bs_shift = shift.max(12);
                p.io_min_shift = shift.max(12);
                p.io_opt_shift = shift.max(12);
                if let Some(m) = max_sectors {
                    p.max_sectors = p.max_sectors.min(m);
                }
                Ok(())
            },
            move |qid: u16, dev: &UblkDev| queue(qid, dev, rt, s, lun, cap.block_size),
            move |c: &libublk::ctrl::UblkCtrl| {
                println!(
                    "ublk device {} is LUN {lun} of {target} ({size} bytes, {}-byte blocks)",
                    c.get_bdev_path(),
                    cap.block_size
                );
            },
        );
        // Delete the device from this thread, whose control ring is set up.
        let _ = runner.del_dev();
        r
    })
    .await
    .context("ublk thread")?
    .map_err(|e| anyhow::anyhow!("ublk device: {e}"))?;
    signals.abort();
    // What the device acknowledged is on the target's medium only after
    // this: a failure is the command's, not something to pass over.
    let flushed = session.synchronize_cache(lun).await;
    // A logout the target leaves unanswered loses nothing: it is said, and
    // the flush alone decides the exit status.
    resizes.stop().await;
    let logged_out: Result<(), String> = match Arc::try_unwrap(session) {
        Ok(s) => s
            .logout()
            .await
            .map_err(|e| format!("logout: {e} (the target ends the session itself)")),
        Err(_) => Err("the session is still in use, so it was not logged out".into()),
    };
    flushed.with_context(|| format!("the final SYNCHRONIZE CACHE of LUN {lun}"))?;
    match logged_out {
        Ok(()) => eprintln!("blockwire ublk: device deleted, logged out"),
        Err(why) => eprintln!("blockwire ublk: device deleted; {why}"),
    }
    Ok(())
}

/// One queue's thread: a task per tag on a local executor.
fn queue(qid: u16, dev: &UblkDev, rt: Handle, s: Arc<Session>, lun: u16, block_size: u32) {
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => std::rc::Rc::new(q),
        Err(e) => {
            eprintln!("blockwire ublk: queue {qid}: {e}");
            return;
        }
    };
    let exe = std::rc::Rc::new(smol::LocalExecutor::new());
    let mut tasks = Vec::new();
    for tag in 0..dev.dev_info.queue_depth {
        let (q, rt, s) = (q.clone(), rt.clone(), s.clone());
        tasks.push(exe.spawn(async move {
            match io_task(&q, tag, rt, s, lun, block_size).await {
                Ok(()) | Err(UblkError::QueueIsDown) => {}
                Err(e) => eprintln!("blockwire ublk: tag {tag}: {e}"),
            }
        }));
    }
    let ex = exe.clone();
    smol::block_on(exe.run(async move {
        let run_ops = || while ex.try_tick() {};
        let done = || tasks.iter().all(|t| t.is_finished());
        if let Err(e) = libublk::wait_and_handle_io_events(&q, Some(20), run_ops, done).await {
            eprintln!("blockwire ublk: queue {qid}: {e}");
        }
    }));
}

/// `blocks` of `block_size` bytes in 512-byte sectors (ublk's max_sectors
/// unit), at least one block's worth.
fn sectors_of(blocks: u32, block_size: u32) -> u32 {
    let per_block = (block_size / 512).max(1);
    blocks.max(1).saturating_mul(per_block)
}

/// The kernel's page size.
fn page_size() -> u64 {
    rustix::param::page_size() as u64
}
