//! The data-mover seam (DESIGN.md, principle 3): the SCSI core says what
//! data a command yields or needs; a mover moves it.
//!
//! A READ's payload leaves by one of these roads, chosen in one place
//! ([`choose_read`]):
//! - from the core's buffer ([`Road::Core`]: the core runs on the blocking
//!   pool and its result is answered whole),
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
//! ([`WriteData`]).
//!
//! Written once here: the Data-In queueing of a PDU under the task set's
//! lock ([`DataIn::push`]), the answer of a core result on each wire
//! ([`ReadMover::answer`]), the `--no-net` answer, the RDMA Write of a core
//! result, the panic answer (HARDWARE ERROR, INTERNAL TARGET FAILURE,
//! 44/00: [`in_core`]) and plan-or-fall-back ([`plan_or_core`]).

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use blockwire_pdu::Bhs;
use blockwire_transport::assist::{Descriptor, Direction};
use tracing::{debug, warn};

use super::connection::Outgoing;
use super::datain::{self, DataInSegment};
use super::rdma::{RdmaService, Slot};
use super::response::{data_in_header, response_pdus, Residual};
use super::sendfile::SendfileLun;
use super::syncread::SyncReadLun;
use super::task::{data_phase_error, CommandContext};
use super::Fabric;
use crate::copies::{self, CopyPath, Counts};
use crate::datapath::SendOrder;
use crate::scsi::read_plan::{PlannedRead, ReadPlan};
use crate::scsi::ScsiResult;

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
/// RDMA descriptor of an RDMA-assisted command; `data_digest` whether the
/// connection digests data (sendfile cannot: the bytes never reach user
/// space).
pub(super) fn choose(
    fabric: &Fabric,
    target: &str,
    cmd: &blockwire_pdu::pdu::ScsiCommand,
    cdb: &[u8],
    offload: Option<(Arc<Slot>, Descriptor)>,
    data_digest: bool,
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
    // Cached file LUNs: READ payloads by sendfile, unless data digests need
    // the bytes in memory.
    if matches!(wire, Wire::Tcp) {
        if let Some(file) = fabric.sendfile_reads.get(target, lun) {
            if !data_digest {
                return Route {
                    road: Road::File(file),
                    wire,
                };
            }
            debug!(
                itt = cmd.itt,
                "DataDigest on: READ takes the copy path, not sendfile"
            );
        }
    }
    let engine_wire = match &wire {
        Wire::Rdma(p) => p.desc.dir == Direction::Read,
        _ => true,
    };
    if engine_wire {
        if let Some(path) = fabric.sync_reads.get(target, lun) {
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
        if c.is_aborted() {
            return None;
        }
        let capacity = if c.cmd.read {
            c.cmd.expected_data_transfer_length
        } else {
            0
        };
        Some(c.luns.execute(&c.request(&data_out, capacity)))
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
    /// take the plan), with its copies.
    Answer(ScsiResult, Counts),
    /// The road takes it.
    Go(T),
}

/// Plan or fall back (on the blocking pool): the core validates the READ
/// without its data ([`crate::scsi::LunTable::plan_read`]); `take` turns
/// the plan into the road's work, or None to have the core answer the
/// READ whole (the serial path), as for anything the core does not plan.
pub(super) async fn plan_or_core<T: Send + 'static>(
    ctx: &Arc<CommandContext>,
    take: impl FnOnce(&CommandContext, PlannedRead) -> Option<T> + Send + 'static,
) -> Planned<T> {
    let r = in_core(ctx, move |c| {
        if c.is_aborted() {
            return None;
        }
        let req = c.read_request();
        Some(match c.luns.plan_read(&req) {
            ReadPlan::NotPlanned => Err(c.luns.execute(&req)),
            ReadPlan::Answer(r) => Err(r),
            ReadPlan::Read(p) => match take(c, p) {
                Some(t) => Ok(t),
                None => Err(c.luns.execute(&req)),
            },
        })
    })
    .await;
    match r {
        Ok((None, _)) => Planned::Aborted,
        Ok((Some(Ok(t)), _)) => Planned::Go(t),
        Ok((Some(Err(r)), core)) => Planned::Answer(r, core),
        Err(failure) => Planned::Answer(failure, Counts::default()),
    }
}

/// Sets ExpDataSN of the SCSI Response among `pdus` to `data_ins`, the
/// Data-In PDUs already sent, when there were any.
fn with_data_ins(mut pdus: Vec<blockwire_pdu::Pdu>, data_ins: u32) -> Vec<blockwire_pdu::Pdu> {
    if data_ins > 0 {
        for p in &mut pdus {
            if let Bhs::ScsiResponse(r) = &mut p.bhs {
                r.exp_data_sn = data_ins;
            }
        }
    }
    pdus
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

/// TCP Data-In PDUs.
pub(super) struct DataIn {
    /// Whether a core answer's payload starts the command's copy tally on
    /// the copy path (the engine road started its own).
    tally: bool,
    /// Data-In PDUs queued so far (ExpDataSN of a later SCSI Response).
    queued: u32,
    stamper: Option<super::syncread::DataInStamper>,
    next_offset: u32,
    /// The engine LUN whose reordered Data-In PDUs (sent at another offset
    /// than where the previous one ended: DataPDUInOrder=No at work) are
    /// counted.
    engine: Option<Arc<SyncReadLun>>,
}

/// What [`DataIn::push`] did.
pub(super) enum Pushed {
    /// Queued; more follow.
    Queued,
    /// The last one, with the status: the task ended (true if it was
    /// still live and the PDU was queued).
    Last(bool),
    /// Aborted, or the connection is gone: the task ended, nothing more
    /// was queued.
    Stopped,
}

impl DataIn {
    /// A mover whose core answers start a copy-path tally when `tally`.
    pub(super) fn new(tally: bool) -> DataIn {
        DataIn {
            tally,
            queued: 0,
            stamper: None,
            next_offset: 0,
            engine: None,
        }
    }

    /// A mover for engine chunks of `path` (whose road keeps its own copy
    /// tally).
    pub(super) fn engine(path: Arc<SyncReadLun>) -> DataIn {
        DataIn {
            engine: Some(path),
            ..DataIn::new(false)
        }
    }

    /// Queues the Data-In PDU of segment `seg` (its payload made by
    /// `item` around the header), under the task set's lock so nothing of
    /// an aborted task follows the task management response. The last one
    /// carries GOOD and `residual` and ends the task.
    pub(super) async fn push(
        &mut self,
        ctx: &CommandContext,
        seg: &DataInSegment,
        residual: Residual,
        item: impl FnOnce(Bhs) -> Outgoing,
    ) -> Pushed {
        if seg.last {
            let bhs = data_in_header(&ctx.cmd, seg, Some((0, residual)));
            let mine = ctx.finish();
            if mine {
                ctx.send_and_forget([item(bhs)]).await;
            } else {
                ctx.shared.copies.forget(ctx.itt());
            }
            return Pushed::Last(mine);
        }
        let out = item(data_in_header(&ctx.cmd, seg, None));
        let live = match ctx.tx.reserve().await {
            Ok(permit) => ctx
                .session
                .tasks
                .while_live(ctx.itt(), &ctx.aborted, move || permit.send(out)),
            // The connection is gone.
            Err(_) => false,
        };
        if !live {
            debug!(
                itt = ctx.itt(),
                sent = self.queued,
                "READ stopped while sending"
            );
            ctx.shared.copies.forget(ctx.itt());
            self.answer(ctx, None, 0).await;
            return Pushed::Stopped;
        }
        self.queued += 1;
        Pushed::Queued
    }
}

impl ReadMover for DataIn {
    async fn answer(
        &mut self,
        ctx: &CommandContext,
        result: Option<(ScsiResult, Counts)>,
        r2t_count: u32,
    ) -> bool {
        let (tally, queued) = (self.tally, self.queued);
        ctx.answer(|| match result {
            Some((r, core)) => {
                if tally && ctx.cmd.read && !r.data_in.is_empty() {
                    ctx.shared
                        .copies
                        .begin(ctx.itt(), CopyPath::Copy, core, false);
                }
                with_data_ins(response_pdus(&ctx.cmd, r, ctx.limits, r2t_count), queued)
            }
            None => Vec::new(),
        })
        .await
    }

    fn layout(&self, ctx: &CommandContext, in_order: bool) -> Layout {
        Layout {
            data_in: Some(ctx.limits),
            order: if in_order {
                SendOrder::InOrder
            } else {
                SendOrder::AnyOrder
            },
        }
    }

    fn wire(&self) -> &'static str {
        "tcp"
    }

    async fn chunks(
        &mut self,
        ctx: &CommandContext,
        units: Vec<(usize, Range<u64>, bytes::Bytes)>,
        len: u64,
    ) -> Flow {
        let residual = Residual::of(ctx.cmd.expected_data_transfer_length, len as u32);
        let stamper = self.stamper.get_or_insert_with(|| {
            super::syncread::DataInStamper::new(
                datain::segments(
                    u64::from(ctx.cmd.expected_data_transfer_length).min(len) as u32,
                    ctx.limits.max_recv_data_segment_length,
                    ctx.limits.max_burst_length,
                )
                .collect(),
            )
        });
        let mut bytes: std::collections::HashMap<usize, bytes::Bytes> =
            units.iter().map(|(u, _, b)| (*u, b.clone())).collect();
        let released = stamper.release(units.into_iter().map(|(u, _, _)| u));
        for (u, seg) in released {
            if seg.offset != self.next_offset {
                if let Some(path) = &self.engine {
                    path.reordered_pdus.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.next_offset = seg.offset + seg.length;
            let data = bytes.remove(&u).unwrap_or_default();
            let item = |bhs| Outgoing::Pdu(blockwire_pdu::Pdu::with_data(bhs, data));
            match self.push(ctx, &seg, residual, item).await {
                Pushed::Queued => {}
                Pushed::Last(mine) => return Flow::Ended(mine),
                Pushed::Stopped => return Flow::Ended(false),
            }
        }
        Flow::More
    }

    fn may_fall_back(&self) -> bool {
        self.queued == 0
    }

    async fn end(&mut self, ctx: &CommandContext, failure: Option<ScsiResult>, _: u64) -> bool {
        // Reached only when the read failed after some Data-In left.
        self.answer(ctx, failure.map(|r| (r, Counts::default())), 0)
            .await;
        false
    }
}

/// RDMA Write into the initiator's buffer (RDMA-assisted iSCSI); the SCSI
/// Response follows on TCP, after the last Write.
pub(super) struct RdmaWrite {
    placement: RdmaPlacement,
    writes: tokio::task::JoinSet<Result<(), super::rdma::TransferError>>,
    aborted: bool,
}

impl RdmaWrite {
    /// A mover into `placement`.
    pub(super) fn new(placement: RdmaPlacement) -> RdmaWrite {
        placement
            .svc
            .counters()
            .offloaded_commands
            .fetch_add(1, Ordering::Relaxed);
        RdmaWrite {
            placement,
            writes: tokio::task::JoinSet::new(),
            aborted: false,
        }
    }

    /// The initiator's buffer this mover writes.
    pub(super) fn placement(&self) -> &RdmaPlacement {
        &self.placement
    }
}

impl ReadMover for RdmaWrite {
    async fn answer(
        &mut self,
        ctx: &CommandContext,
        result: Option<(ScsiResult, Counts)>,
        r2t_count: u32,
    ) -> bool {
        // READ data go into the initiator's buffer before the status.
        let result = match result {
            Some((mut r, _)) if !r.data_in.is_empty() => {
                let p = &self.placement;
                let n = (ctx.cmd.expected_data_transfer_length as usize).min(r.data_in.len());
                match p.svc.write_to(&p.slot, &p.desc, &r.data_in[..n]).await {
                    Ok(()) => {
                        r.data_in = Vec::new();
                        Some(r)
                    }
                    Err(e) => {
                        warn!(itt = ctx.itt(), error = %e.0, "RDMA Write of read data failed");
                        Some(data_phase_error())
                    }
                }
            }
            r => r.map(|(r, _)| r),
        };
        ctx.answer(|| match result {
            Some(r) => response_pdus(&ctx.cmd, r, ctx.limits, r2t_count),
            None => Vec::new(),
        })
        .await
    }

    fn layout(&self, _: &CommandContext, _: bool) -> Layout {
        // One Write per chunk, at its offset, in any order.
        Layout {
            data_in: None,
            order: SendOrder::AnyOrder,
        }
    }

    fn wire(&self) -> &'static str {
        "rdma"
    }

    async fn chunks(
        &mut self,
        ctx: &CommandContext,
        units: Vec<(usize, Range<u64>, bytes::Bytes)>,
        _: u64,
    ) -> Flow {
        for (_, r, data) in units {
            if ctx.is_aborted() {
                self.aborted = true;
                return Flow::Done;
            }
            let p = &self.placement;
            let (svc, slot, desc) = (p.svc.clone(), p.slot.clone(), p.desc.clone());
            self.writes
                .spawn(async move { svc.write_at(&slot, &desc, r.start, &data).await });
        }
        Flow::More
    }

    fn may_fall_back(&self) -> bool {
        false
    }

    async fn end(&mut self, ctx: &CommandContext, failure: Option<ScsiResult>, len: u64) -> bool {
        let mut failure = failure;
        // The status follows every Write (and no Write outlives the command).
        while let Some(w) = self.writes.join_next().await {
            let e = match w {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.0,
                Err(e) => e.to_string(),
            };
            if failure.is_none() {
                warn!(itt = ctx.itt(), error = %e, "RDMA Write of read data failed");
                failure = Some(data_phase_error());
            }
        }
        if self.aborted {
            self.answer(ctx, None, 0).await;
            return false;
        }
        let ok = failure.is_none();
        let result = failure.unwrap_or(ScsiResult {
            status: 0,
            sense: None,
            data_in: Vec::new(),
            transfer_length: len as u32,
        });
        self.answer(ctx, Some((result, Counts::default())), 0).await;
        ok
    }
}

/// `--no-net` (benchmark only): a media READ's data are dropped as they
/// become valid; the command ends GOOD with an underflow of its whole
/// Expected Data Transfer Length, counted under [`CopyPath::NoNet`].
pub(super) struct Discard {
    /// Whether the engine's reads are buffered (a kernel copy into the
    /// registered buffer; an O_DIRECT one is DMA).
    pub buffered: bool,
}

/// GOOD, no data: `response_pdus` reports a residual underflow of the
/// whole Expected Data Transfer Length.
fn no_net_result() -> ScsiResult {
    ScsiResult {
        status: 0,
        sense: None,
        data_in: Vec::new(),
        transfer_length: 0,
    }
}

impl Discard {
    /// Ends the command the `--no-net` way, counting `counts` if it was
    /// still live.
    async fn good(ctx: &CommandContext, counts: Counts) -> bool {
        let mine = ctx
            .answer(|| response_pdus(&ctx.cmd, no_net_result(), ctx.limits, 0))
            .await;
        if mine {
            copies::add(CopyPath::NoNet, &counts);
        }
        mine
    }
}

impl ReadMover for Discard {
    async fn answer(
        &mut self,
        ctx: &CommandContext,
        result: Option<(ScsiResult, Counts)>,
        r2t_count: u32,
    ) -> bool {
        match result {
            // Read, not sent.
            Some((r, core)) if r.status == 0 && r.sense.is_none() => {
                let counts = Counts {
                    commands: 1,
                    payload: r.data_in.len() as u64,
                    ..core
                };
                Discard::good(ctx, counts).await
            }
            // Errors go out as they are.
            result => DataIn::new(false).answer(ctx, result, r2t_count).await,
        }
    }

    fn layout(&self, ctx: &CommandContext, in_order: bool) -> Layout {
        // The same chunks and units as the Data-In it stands for.
        DataIn::new(false).layout(ctx, in_order)
    }

    fn wire(&self) -> &'static str {
        "no-net"
    }

    async fn chunks(
        &mut self,
        _: &CommandContext,
        _: Vec<(usize, Range<u64>, bytes::Bytes)>,
        _: u64,
    ) -> Flow {
        Flow::More
    }

    fn may_fall_back(&self) -> bool {
        true
    }

    async fn end(&mut self, ctx: &CommandContext, failure: Option<ScsiResult>, len: u64) -> bool {
        if let Some(r) = failure {
            return self.answer(ctx, Some((r, Counts::default())), 0).await;
        }
        let bytes = u64::from(ctx.cmd.expected_data_transfer_length).min(len);
        let counts = Counts {
            commands: 1,
            payload: bytes,
            read_to_user: if self.buffered { bytes } else { 0 },
            ..Counts::default()
        };
        Discard::good(ctx, counts).await
    }
}

/// Where a WRITE's data come from, for a command the core runs whole.
pub(super) enum WriteData {
    /// Gathered from immediate data and Data-Out PDUs (or none).
    Gathered(Vec<u8>),
    /// In the initiator's buffer: RDMA Read before execution.
    RdmaRead(Arc<RdmaService>, Arc<Slot>, Descriptor),
}

impl WriteData {
    /// The data, or None if RDMA could not move them (the command then
    /// fails with ABORTED COMMAND, DATA PHASE ERROR, never executed).
    pub(super) async fn fetch(self, itt: u32) -> Option<Vec<u8>> {
        match self {
            WriteData::Gathered(d) => Some(d),
            WriteData::RdmaRead(svc, slot, desc) => match svc.read_from(&slot, &desc).await {
                Ok(d) => Some(d),
                Err(e) => {
                    warn!(itt, error = %e.0, "RDMA Read of write data failed: command not executed");
                    None
                }
            },
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
        Wire::Tcp => answer_core(&ctx, DataIn::new(true), Some(data_out), hold, r2t_count).await,
        Wire::NoNet => {
            let m = Discard { buffered: false };
            answer_core(&ctx, m, Some(data_out), hold, r2t_count).await
        }
        Wire::Rdma(p) => {
            let m = RdmaWrite::new(p);
            let p = m.placement();
            let from = if p.desc.dir == Direction::Write {
                WriteData::RdmaRead(p.svc.clone(), p.slot.clone(), p.desc.clone())
            } else {
                WriteData::Gathered(data_out)
            };
            let data = from.fetch(ctx.itt()).await;
            answer_core(&ctx, m, data, hold, r2t_count).await
        }
    }
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
