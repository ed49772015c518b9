//! The [`ReadMover`] of each [`Wire`](super::Wire): [`DataIn`] (TCP
//! Data-In PDUs, RFC 7143 11.7), [`RdmaWrite`] (RDMA Write into the
//! initiator's buffer, RDMA-assisted iSCSI) and [`Discard`] (`--no-net`,
//! benchmark only). The roads ([`super::choose`]) and the core calls stay in
//! the parent module; these are the three ways a payload and its status
//! leave.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use blockwire_pdu::Bhs;
use tracing::{debug, warn};

use super::{Flow, Layout, RdmaPlacement, ReadMover};
use crate::copies::{self, CopyPath, Counts};
use crate::datapath::SendOrder;
use crate::iscsi::connection::Outgoing;
use crate::iscsi::datain::{self, DataInSegment};
use crate::iscsi::response::{data_in_header, response_pdus, response_pdus_holding, Residual};
use crate::iscsi::syncread::SyncReadLun;
use crate::iscsi::task::{data_phase_error, CommandContext};
use crate::scsi::ScsiResult;

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

/// TCP Data-In PDUs.
pub(in crate::iscsi) struct DataIn {
    /// Whether a core answer's payload starts the command's copy tally on
    /// the copy path (the engine road started its own).
    tally: bool,
    /// Data-In PDUs queued so far (ExpDataSN of a later SCSI Response).
    queued: u32,
    stamper: Option<crate::iscsi::syncread::DataInStamper<bytes::Bytes>>,
    next_offset: u32,
    /// The engine LUN whose reordered Data-In PDUs (sent at another offset
    /// than where the previous one ended: DataPDUInOrder=No at work) are
    /// counted.
    engine: Option<Arc<SyncReadLun>>,
    /// The share of the connection's READ budget a core answer's data hold
    /// until sent ([`DataIn::holding`]).
    share: Option<crate::iscsi::budget::ReadDataHeld>,
}

/// What [`DataIn::push`] did.
pub(in crate::iscsi) enum Pushed {
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
    pub(in crate::iscsi) fn new(tally: bool) -> DataIn {
        DataIn {
            tally,
            queued: 0,
            stamper: None,
            next_offset: 0,
            engine: None,
            share: None,
        }
    }

    /// This mover, its core answer's data holding `share` of the
    /// connection's READ budget until the last of them is sent.
    pub(in crate::iscsi) fn holding(
        self,
        share: Option<crate::iscsi::budget::ReadDataHeld>,
    ) -> DataIn {
        DataIn { share, ..self }
    }

    /// A mover for engine chunks of `path` (whose road keeps its own copy
    /// tally).
    pub(in crate::iscsi) fn engine(path: Arc<SyncReadLun>) -> DataIn {
        DataIn {
            engine: Some(path),
            ..DataIn::new(false)
        }
    }

    /// Queues the Data-In PDU of segment `seg` (its payload made by
    /// `item` around the header), under the task set's lock so nothing of
    /// an aborted task follows the task management response. The last one
    /// carries GOOD and `residual` and ends the task.
    pub(in crate::iscsi) async fn push(
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
        let (tally, queued, share) = (self.tally, self.queued, self.share.take());
        ctx.answer(|| match result {
            Some((r, core)) => {
                if tally && ctx.cmd.read && !r.data_in.is_empty() {
                    ctx.shared
                        .copies
                        .begin(ctx.itt(), CopyPath::Copy, core, false);
                }
                let pdus = response_pdus_holding(&ctx.cmd, r, ctx.limits, r2t_count, share);
                with_data_ins(pdus, queued)
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
            crate::iscsi::syncread::DataInStamper::new(
                datain::segments(
                    u64::from(ctx.cmd.expected_data_transfer_length).min(len) as u32,
                    ctx.limits.max_recv_data_segment_length,
                    ctx.limits.max_burst_length,
                )
                .collect(),
            )
        });
        // A unit of a later sequence is held by the stamper with its bytes
        // until its sequence comes, in this call or a later one.
        let released = stamper.release(units.into_iter().map(|(u, _, b)| (u, b)));
        for (_, seg, data) in released {
            if seg.offset != self.next_offset {
                if let Some(path) = &self.engine {
                    path.reordered_pdus.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.next_offset = seg.offset + seg.length;
            let item = |bhs| Outgoing::Pdu(blockwire_pdu::Pdu::with_data(bhs, data));
            match self.push(ctx, &seg, residual, item).await {
                Pushed::Queued => {}
                Pushed::Last(mine) => return Flow::Ended(mine),
                Pushed::Stopped => return Flow::Ended(false),
            }
        }
        Flow::More
    }

    fn keep_share(&mut self, share: super::ReadShare) {
        self.share = share;
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
pub(in crate::iscsi) struct RdmaWrite {
    placement: RdmaPlacement,
    writes: tokio::task::JoinSet<Result<(), crate::iscsi::rdma::TransferError>>,
    aborted: bool,
    /// A core answer's share of the READ budget, kept until its data are
    /// written into the initiator's buffer.
    share: super::ReadShare,
}

impl RdmaWrite {
    /// A mover into `placement`.
    pub(in crate::iscsi) fn new(placement: RdmaPlacement) -> RdmaWrite {
        placement
            .svc
            .counters()
            .offloaded_commands
            .fetch_add(1, Ordering::Relaxed);
        RdmaWrite {
            placement,
            writes: tokio::task::JoinSet::new(),
            aborted: false,
            share: None,
        }
    }

    /// The initiator's buffer this mover writes.
    pub(in crate::iscsi) fn placement(&self) -> &RdmaPlacement {
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
        let _share = self.share.take();
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

    fn keep_share(&mut self, share: super::ReadShare) {
        self.share = share;
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
pub(in crate::iscsi) struct Discard {
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

    fn keep_share(&mut self, share: super::ReadShare) {
        // Read, never sent: the data are dropped with the answer.
        drop(share);
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
