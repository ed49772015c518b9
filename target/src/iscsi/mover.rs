//! The data-mover seam (DESIGN.md, principle 3): the SCSI core says what
//! data a command yields or needs; a mover moves it.
//!
//! A READ's payload leaves by one of these roads, chosen in one place
//! ([`choose`]):
//! - from the core's buffer ([`Road::Core`]: the core runs on the blocking
//!   pool, or on the connection's task for what cannot wait there (small
//!   WRITEs to memory or the page cache, [`write_road`]; small READs and
//!   GET LBA STATUS of RAM LUNs, [`memory_road`]), and its result is
//!   answered whole),
//! - from a file range ([`Road::File`]: sendfile, [`super::sendfile`]),
//! - from registered engine chunks as they complete ([`Road::Engine`]:
//!   synchronized or serial sends, [`super::syncread`]).
//!
//! Each road hands the bytes to a [`ReadMover`]: [`DataIn`] (TCP Data-In
//! PDUs), [`RdmaWrite`] (RDMA Write into the initiator's buffer,
//! RDMA-assisted iSCSI) or [`Discard`] (`--no-net`, benchmark only: read,
//! not sent; GOOD with an underflow of the whole Expected Data Transfer
//! Length). A WRITE's payload arrives as immediate data or solicited
//! Data-Out (gathered by the connection's reader, or fed to a
//! double-buffered task, [`super::syncwrite`]) or by RDMA Read
//! ([`rdma_write_data`]).
//!
//! Written once here: the Data-In queueing of a PDU under the task set's
//! lock ([`DataIn::push`]), the answer of a core result on each wire
//! ([`ReadMover::answer`]), the `--no-net` answer, the RDMA Write of a core
//! result, the panic answer (HARDWARE ERROR, INTERNAL TARGET FAILURE,
//! 44/00: [`in_core`]) and plan-or-fall-back ([`plan_or_core`]).
//!
//! The three movers themselves ([`DataIn`], [`RdmaWrite`], [`Discard`])
//! live in the `wires` submodule; this file keeps the roads, the route
//! choice, the core calls and the [`ReadMover`] contract they implement.

use std::ops::Range;
use std::sync::Arc;

use blockwire_transport::assist::{Descriptor, Direction};
use tracing::warn;

use super::datain;
use super::rdma::{RdmaService, Slot};
use super::sendfile::SendfileLun;
use super::syncread::SyncReadLun;
use super::task::{data_phase_error, CommandContext};
use super::Fabric;
use crate::copies::{self, Counts};
use crate::datapath::SendOrder;
use crate::scsi::read_plan::{PlannedRead, ReadPlan};
use crate::scsi::ScsiResult;

mod wires;

pub(super) use wires::{DataIn, Discard, Pushed, RdmaWrite};

/// Where a READ's payload comes from.
pub(super) enum Road {
    /// The core's buffer: the core runs the command whole.
    Core,
    /// A range of the LUN's file, by sendfile.
    File(Arc<SendfileLun>),
    /// Registered engine chunks, sent as they become valid.
    Engine(Arc<SyncReadLun>),
}

/// The initiator's buffer an RDMA-assisted command's data go to or come
/// from.
pub(super) struct RdmaPlacement {
    pub svc: Arc<RdmaService>,
    pub slot: Arc<Slot>,
    pub desc: Descriptor,
}

/// How a command's data move, chosen once as it is about to execute.
pub(super) struct Route {
    pub road: Road,
    pub wire: Wire,
}

/// The wire a command's data take.
pub(super) enum Wire {
    /// TCP: Data-In PDUs (READ), immediate data and Data-Out (WRITE).
    Tcp,
    /// RDMA-assisted: RDMA Write (READ) or Read (WRITE) of the initiator's
    /// buffer.
    Rdma(RdmaPlacement),
    /// `--no-net`: a media READ's data are read and dropped.
    NoNet,
}

/// READ(6/10/12/16): the commands whose data `--no-net` does not send.
pub(super) fn is_media_read(cdb: &[u8]) -> bool {
    matches!(cdb.first(), Some(0x08 | 0x28 | 0xa8 | 0x88))
}

/// The one place a command's road and wire are chosen. `offload` is the
/// RDMA descriptor of an RDMA-assisted command.
pub(super) fn choose(
    fabric: &Fabric,
    target: &str,
    cmd: &blockwire_pdu::pdu::ScsiCommand,
    cdb: &[u8],
    offload: Option<(Arc<Slot>, Descriptor)>,
) -> Route {
    let wire = match (offload, fabric.rdma.get()) {
        (Some((slot, desc)), Some(svc)) => Wire::Rdma(RdmaPlacement {
            svc: svc.clone(),
            slot,
            desc,
        }),
        _ if fabric.settings.no_net && cmd.read && !cmd.write && is_media_read(cdb) => Wire::NoNet,
        _ => Wire::Tcp,
    };
    if !cmd.read || cmd.write {
        return Route {
            road: Road::Core,
            wire,
        };
    }
    let lun = cmd.lun.index().unwrap_or(u16::MAX);
    let Some(paths) = fabric.lun_paths.get(target, lun) else {
        return Route {
            road: Road::Core,
            wire,
        };
    };
    // Cached file LUNs: READ payloads by sendfile. On a connection with
    // DataDigest the connection's writer reads each payload from the page
    // cache instead, to digest it (`PduWriter::push_file`): the same road,
    // no hop to the blocking pool and back, which halved 4 KiB READs.
    if matches!(wire, Wire::Tcp) {
        if let Some(file) = paths.sendfile.clone() {
            return Route {
                road: Road::File(file),
                wire,
            };
        }
    }
    let engine_wire = match &wire {
        Wire::Rdma(p) => p.desc.dir == Direction::Read,
        _ => true,
    };
    if engine_wire {
        if let Some(path) = paths.engine_reads.clone() {
            return Route {
                road: Road::Engine(path),
                wire,
            };
        }
    }
    Route {
        road: Road::Core,
        wire,
    }
}

/// Runs `f` (calls into the SCSI core) on the blocking pool under the
/// task's abort flag, with the copies it made. A panic is logged and
/// becomes HARDWARE ERROR, INTERNAL TARGET FAILURE (44/00), so the
/// initiator is not left waiting.
pub(super) async fn in_core<T: Send + 'static>(
    ctx: &Arc<CommandContext>,
    f: impl FnOnce(&CommandContext) -> T + Send + 'static,
) -> Result<(T, Counts), ScsiResult> {
    let c = ctx.clone();
    tokio::task::spawn_blocking(move || c.in_core(|| copies::counted(|| f(&c))))
        .await
        .map_err(|e| ctx.panicked(&e))
}

/// The core's answer to the command, with WRITE data `data_out`, or None
/// if the task was aborted before it ran. `hold` (e.g. the WRITE data's
/// share of the connection's budget) is released when the core returns.
pub(super) async fn run_core(
    ctx: &Arc<CommandContext>,
    data_out: Vec<u8>,
    hold: impl Send + 'static,
) -> Option<(ScsiResult, Counts)> {
    let r = in_core(ctx, move |c| {
        let _hold = hold;
        // The WRITE data's buffer is kept for a later command's data once
        // the core has written it (crate::payload_buffers).
        let data_out = crate::payload_buffers::Returning(data_out);
        if c.is_aborted() {
            return None;
        }
        let capacity = if c.cmd.read {
            c.cmd.expected_data_transfer_length
        } else {
            0
        };
        Some(c.luns.execute(&c.request(&data_out.0, capacity)))
    })
    .await;
    match r {
        Ok((Some(r), core)) => Some((r, core)),
        Ok((None, _)) => None,
        Err(failure) => Some((failure, Counts::default())),
    }
}

/// What planning a READ decided.
pub(super) enum Planned<T> {
    /// Aborted before it ran.
    Aborted,
    /// The core answered (not plannable, an error, or the road could not
    /// take the plan), with its copies and, when it read the data whole
    /// into memory, their share of the connection's READ budget (for
    /// [`ReadMover::keep_share`]).
    Answer(ScsiResult, Counts, ReadShare),
    /// The road takes it.
    Go(T),
}

/// Plan or fall back (on the blocking pool): the core validates the READ
/// without its data ([`crate::scsi::LunTable::plan_read`]); `take` turns
/// the plan into the road's work, or None to have the core answer the
/// READ whole (the serial path), as for anything the core does not plan.
/// A protected unit's READ is never the road's: the core reads and checks
/// its blocks ([`crate::scsi::LogicalUnit::read_checked`]), here when they
/// are small and in memory, else on the blocking pool.
pub(super) async fn plan_or_core<T: Send + 'static>(
    ctx: &Arc<CommandContext>,
    take: impl FnOnce(&CommandContext, PlannedRead) -> Option<T> + Send + 'static,
) -> Planned<T> {
    /// What planning on the connection's task came to.
    enum Inline {
        Aborted,
        Answer(ScsiResult),
        Plan(PlannedRead),
        /// A protected unit's READ to be read where waiting is allowed.
        Checked(PlannedRead),
    }
    let capacity = ctx.cmd.expected_data_transfer_length;
    // Planning is CPU work (the CDB, reservations, unit attentions, the range): done
    // here, on the connection's task, it saves the hand-off to a blocking thread and
    // back that a small READ would otherwise pay. Only a stalled unit waits, and only
    // commands the core must run itself do I/O: those go to the blocking pool.
    let (inline, core) = ctx.in_core(|| {
        copies::counted(|| {
            if ctx.is_aborted() {
                return Some(Inline::Aborted);
            }
            match crate::scsi::stall::without_waiting(|| ctx.luns.plan_read(&ctx.read_request())) {
                ReadPlan::Read(p) => Some(Inline::Plan(p)),
                ReadPlan::Checked(p) if p.len <= MEMORY_READ_ON_TASK_MAX => {
                    Some(match p.lu.read_checked_without_waiting(&p, capacity) {
                        Some(r) => Inline::Answer(r),
                        None => Inline::Checked(p),
                    })
                }
                ReadPlan::Checked(p) => Some(Inline::Checked(p)),
                ReadPlan::Answer(r) => Some(Inline::Answer(r)),
                ReadPlan::NotPlanned | ReadPlan::WouldWait => None,
            }
        })
    });
    match inline {
        Some(Inline::Aborted) => return Planned::Aborted,
        Some(Inline::Answer(r)) => return Planned::Answer(r, core, None),
        Some(Inline::Plan(plan)) => {
            let clock = plan.clock.clone();
            if let Some(t) = take(ctx, plan) {
                return Planned::Go(t);
            }
            // Valid but not for this path: the core runs it, and counts it.
            clock.forget();
            drop(clock);
            let share = read_share(ctx).await;
            return match run_core(ctx, Vec::new(), ()).await {
                None => Planned::Aborted,
                Some((r, c)) => Planned::Answer(r, c, share),
            };
        }
        Some(Inline::Checked(plan)) => {
            let share = read_share(ctx).await;
            let r = in_core(ctx, move |c| {
                (!c.is_aborted()).then(|| plan.lu.read_checked(&plan, capacity))
            })
            .await;
            return match r {
                Ok((Some(r), c)) => Planned::Answer(r, c, share),
                Ok((None, _)) => Planned::Aborted,
                Err(failure) => Planned::Answer(failure, Counts::default(), None),
            };
        }
        None => {}
    }
    /// What the core did with a READ planning had to wait for.
    enum Waited<T> {
        Go(T),
        Answer(ScsiResult, ReadShare),
        /// The core would read the data whole, and the connection's READ
        /// budget had no room for them: nothing was read.
        NeedsShare,
    }
    let r = in_core(ctx, move |c| {
        if c.is_aborted() {
            return None;
        }
        let req = c.read_request();
        // Where the core reads the data whole, they take their share of
        // the READ budget first, once planning has waited out a stalled
        // unit (so a stalled LUN's READs hold no budget the connection's
        // other READs need), and only if it has room now: a blocking-pool
        // thread waiting for it could hold up the READs whose data would
        // give it back.
        let whole = |c: &CommandContext, run: &dyn Fn() -> ScsiResult| match try_read_share(c) {
            Ok(share) => Waited::Answer(run(), share),
            Err(()) => Waited::NeedsShare,
        };
        Some(match c.luns.plan_read(&req) {
            ReadPlan::NotPlanned | ReadPlan::WouldWait => whole(c, &|| c.luns.execute(&req)),
            ReadPlan::Answer(r) => Waited::Answer(r, None),
            ReadPlan::Checked(p) => {
                let clock = p.clock.clone();
                let w = whole(c, &|| p.lu.read_checked(&p, capacity));
                if let Waited::NeedsShare = w {
                    // Counted when the core runs it after all.
                    clock.forget();
                }
                w
            }
            ReadPlan::Read(p) => {
                let clock = p.clock.clone();
                match take(c, p) {
                    Some(t) => Waited::Go(t),
                    None => {
                        clock.forget();
                        drop(clock);
                        whole(c, &|| c.luns.execute(&req))
                    }
                }
            }
        })
    })
    .await;
    match r {
        Ok((None, _)) => Planned::Aborted,
        Ok((Some(Waited::Go(t)), _)) => Planned::Go(t),
        Ok((Some(Waited::Answer(r, share)), core)) => Planned::Answer(r, core, share),
        Ok((Some(Waited::NeedsShare), _)) => {
            let share = read_share(ctx).await;
            match run_core(ctx, Vec::new(), ()).await {
                None => Planned::Aborted,
                Some((r, c)) => Planned::Answer(r, c, share),
            }
        }
        Err(failure) => Planned::Answer(failure, Counts::default(), None),
    }
}

/// What moving units of engine chunks led to.
pub(super) enum Flow {
    /// Go on.
    More,
    /// Stop handing units over: end the command ([`ReadMover::end`]).
    Done,
    /// The command ended: answered (true: GOOD, its timers are worth
    /// recording), or stopped (false: aborted, connection gone).
    Ended(bool),
}

/// How an engine read is cut into units.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    /// One unit per Data-In PDU of these limits; None: one per chunk.
    data_in: Option<super::response::DataInLimits>,
    /// The order units may leave in.
    pub order: SendOrder,
}

impl Layout {
    /// The units of a read of `len` bytes (None: one per chunk).
    pub(super) fn units(&self, len: u32) -> Option<Vec<Range<u64>>> {
        self.data_in.map(|l| {
            datain::segments(len, l.max_recv_data_segment_length, l.max_burst_length)
                .map(|s| u64::from(s.offset)..u64::from(s.offset + s.length))
                .collect()
        })
    }
}

/// Moves a READ's payload (and a command's status) to the initiator.
pub(super) trait ReadMover: Send {
    /// Answers with a result the core computed whole (`result`, with the
    /// copies `core` made; None: aborted), `r2t_count` R2Ts sent (a
    /// WRITE's ExpDataSN). Returns whether the task was still live.
    fn answer(
        &mut self,
        ctx: &CommandContext,
        result: Option<(ScsiResult, Counts)>,
        r2t_count: u32,
    ) -> impl std::future::Future<Output = bool> + Send;

    /// How an engine read is cut into units and the order they may leave
    /// in (`in_order`: DataPDUInOrder=Yes).
    fn layout(&self, ctx: &CommandContext, in_order: bool) -> Layout;

    /// The wire's name, for logs.
    fn wire(&self) -> &'static str;

    /// Moves valid units of engine chunks: unit `u` is `bytes` at `range`
    /// of the command's data. `len` is the data the command yields
    /// (transfer length), the units cover the part sent.
    fn chunks(
        &mut self,
        ctx: &CommandContext,
        units: Vec<(usize, Range<u64>, bytes::Bytes)>,
        len: u64,
    ) -> impl std::future::Future<Output = Flow> + Send;

    /// Whether the core may still answer the READ whole after the engine
    /// read failed (nothing left yet).
    fn may_fall_back(&self) -> bool;

    /// The data of the core answer to come, read whole into memory, hold
    /// `share` of the connection's READ budget: kept until they have left.
    fn keep_share(&mut self, share: ReadShare);

    /// Every unit was handed over, or the read failed with `failure` (then
    /// the command ends with it): ends the command. Returns whether it
    /// ended GOOD (its timers are worth recording).
    fn end(
        &mut self,
        ctx: &CommandContext,
        failure: Option<ScsiResult>,
        len: u64,
    ) -> impl std::future::Future<Output = bool> + Send;
}

/// A WRITE's data from the initiator's buffer, by RDMA Read before
/// execution; None if RDMA could not move them (the command then fails with
/// ABORTED COMMAND, DATA PHASE ERROR, never executed).
async fn rdma_write_data(p: &RdmaPlacement, itt: u32) -> Option<Vec<u8>> {
    match p.svc.read_from(&p.slot, &p.desc).await {
        Ok(d) => Some(d),
        Err(e) => {
            warn!(itt, error = %e.0, "RDMA Read of write data failed: command not executed");
            None
        }
    }
}

/// The core road: the core runs the command whole (WRITE data from `data`,
/// `hold` released when it returns) and `wire` answers its result.
pub(super) async fn core_road(
    ctx: Arc<CommandContext>,
    wire: Wire,
    data_out: Vec<u8>,
    hold: impl Send + 'static,
    r2t_count: u32,
) {
    match wire {
        Wire::Tcp => {
            let share = read_share(&ctx).await;
            let m = DataIn::new(true).holding(share);
            answer_core(&ctx, m, Some(data_out), hold, r2t_count).await
        }
        Wire::NoNet => {
            let m = Discard { buffered: false };
            answer_core(&ctx, m, Some(data_out), hold, r2t_count).await
        }
        Wire::Rdma(p) => {
            let m = RdmaWrite::new(p);
            let p = m.placement();
            let (data, share) = if p.desc.dir == Direction::Write {
                (rdma_write_data(p, ctx.itt()).await, None)
            } else if p.svc.bound(&p.slot).await {
                (Some(data_out), read_share(&ctx).await)
            } else {
                // No RDMA connection to write the data by: not read at all
                // (ABORTED COMMAND, DATA PHASE ERROR, like a failed Write).
                warn!(
                    itt = ctx.itt(),
                    "no RDMA connection for the READ's data: command not executed"
                );
                (None, None)
            };
            answer_core(&ctx, m, data, hold, r2t_count).await;
            // The data left: the initiator's RDMA Writes completed (or failed).
            drop(share);
        }
    }
}

/// [`read_share`] if the budget has room now; Err if not.
fn try_read_share(ctx: &CommandContext) -> Result<ReadShare, ()> {
    match read_data_len(ctx) {
        Some(len) => ctx.shared.try_hold_read_data(len),
        None => Ok(None),
    }
}

/// A READ's share of the connection's READ budget (see [`read_share`]).
pub(super) type ReadShare = Option<super::budget::ReadDataHeld>;

/// A READ's share of the connection's READ budget, taken before the core
/// reads its data whole into memory, where they wait for the writer (TCP)
/// or for the RDMA Writes' completion: an initiator that does not take its
/// data holds back its own later READs rather than filling memory.
pub(super) async fn read_share(ctx: &CommandContext) -> ReadShare {
    match read_data_len(ctx) {
        Some(len) => ctx.shared.hold_read_data(len).await,
        None => None,
    }
}

/// The READ data a command may bring, which its share covers; None for a
/// command that reads nothing.
fn read_data_len(ctx: &CommandContext) -> Option<u32> {
    let edtl = ctx.cmd.expected_data_transfer_length;
    (ctx.cmd.read && edtl > 0).then_some(edtl)
}

/// Largest WRITE a connection's task writes itself (see [`write_road`]).
/// Measured on a busy 2-core machine, a `pwrite` into tmpfs's page cache
/// takes about 5 us for 4 KiB, 22 us for 64 KiB and 280 us for 1 MiB; the
/// hand-off to a blocking thread and back costs some tens of microseconds.
/// Up to 64 KiB the copy holds the worker (and the other connections it
/// serves) no longer than a hand-off would; beyond, the copy dominates and
/// is better spent on a blocking thread while the worker keeps receiving.
pub(super) const WRITE_ON_TASK_MAX: u64 = 64 << 10;

/// Largest READ of an in-memory store (RAM) a connection's task answers
/// itself (see [`memory_road`]): copying 64 KiB out of memory takes a few
/// microseconds, less than the hand-off to a blocking thread and back.
pub(super) const MEMORY_READ_ON_TASK_MAX: u64 = 64 << 10;

/// The core road of a WRITE whose data came over TCP. A small plain WRITE
/// to a store that writes to memory is written right here, on the
/// connection's task, through [`crate::scsi::LunTable::write_without_waiting`]
/// (same validation, range lock, in-flight count and answer as the core's
/// path, without the two thread hand-offs that otherwise dominate a 4 KiB
/// WRITE); everything else (durable, large, an unwritable or stalled unit, a
/// range a COMPARE AND WRITE holds) goes to the core on the blocking pool.
pub(super) async fn write_road(
    ctx: Arc<CommandContext>,
    data_out: bytes::Bytes,
    hold: impl Send + 'static,
    r2t_count: u32,
) {
    on_task_or_core(ctx, data_out, hold, r2t_count, |c, data| {
        c.luns
            .write_without_waiting(&c.request(data, 0), WRITE_ON_TASK_MAX)
    })
    .await
}

/// The core road of a small READ or GET LBA STATUS over TCP: when the unit's
/// store keeps its blocks and allocation map in memory (RAM) the core
/// answers it right here, on the connection's task
/// ([`crate::scsi::LunTable::execute_from_memory`]), otherwise on the
/// blocking pool. QEMU asks GET LBA STATUS before each READ of 32 KiB or
/// more, so reading back a RAM LUN was two round trips through the pool per
/// READ.
pub(super) async fn memory_road(
    ctx: Arc<CommandContext>,
    data_out: bytes::Bytes,
    hold: impl Send + 'static,
    r2t_count: u32,
) {
    on_task_or_core(ctx, data_out, hold, r2t_count, |c, data| {
        let capacity = c.cmd.expected_data_transfer_length;
        c.luns
            .execute_from_memory(&c.request(data, capacity), MEMORY_READ_ON_TASK_MAX)
    })
    .await
}

/// Tries `here` (core calls that must not wait) on this task, under the
/// task's abort flag and with its copies counted; None from it hands the
/// command to the core on the blocking pool ([`core_road`]). A panic is
/// answered HARDWARE ERROR, INTERNAL TARGET FAILURE, as on the pool.
async fn on_task_or_core(
    ctx: Arc<CommandContext>,
    data_out: bytes::Bytes,
    hold: impl Send + 'static,
    r2t_count: u32,
    here: impl FnOnce(&CommandContext, &[u8]) -> Option<ScsiResult>,
) {
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ctx.in_core(|| {
            copies::counted(|| {
                if ctx.is_aborted() {
                    return Some(None);
                }
                crate::scsi::stall::without_waiting(|| here(&ctx, &data_out)).map(Some)
            })
        })
    }));
    let result = match done {
        // On the pool the data must not hold the connection's read buffer
        // (a slice of it pins all of it): copied out, unless gathered.
        Ok((None, _)) => return core_road(ctx, Wire::Tcp, data_out.into(), hold, r2t_count).await,
        Ok((Some(r), core)) => r.map(|r| (r, core)),
        Err(_) => {
            tracing::error!(itt = ctx.itt(), "SCSI command panicked");
            Some((super::task::internal_failure(), Counts::default()))
        }
    };
    drop(hold);
    DataIn::new(true).answer(&ctx, result, r2t_count).await;
}

/// Runs the core on `data` and has `m` answer; data RDMA could not move
/// (None) fail the command with ABORTED COMMAND, DATA PHASE ERROR.
async fn answer_core<M: ReadMover>(
    ctx: &Arc<CommandContext>,
    mut m: M,
    data: Option<Vec<u8>>,
    hold: impl Send + 'static,
    r2t_count: u32,
) {
    let result = match data {
        Some(d) => run_core(ctx, d, hold).await,
        None => {
            drop(hold);
            Some((data_phase_error(), Counts::default()))
        }
    };
    m.answer(ctx, result, r2t_count).await;
}
