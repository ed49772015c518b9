//! Starting the commands a connection's [`ConnMachine`](super::machine::ConnMachine)
//! hands over: each runs on the road [`mover::choose`]
//! picks (the SCSI core on the blocking pool or, for small commands a memory
//! store answers at once, on the task itself; sendfile; or the I/O engine
//! with synchronized sends) with the data mover its wire needs (TCP
//! Data-In, RDMA Write, or nothing for `--no-net`), or a double-buffered
//! WRITE's task. A command starts on the connection's reader and becomes a
//! tokio task of its own only when it has to wait (see [`start`]). Also the
//! bounded wait task management needs before its response leaves.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use blockwire_pdu::Pdu;
use tokio::sync::mpsc;

use super::connection::Outgoing;
use super::machine::{ConnMachine, PipedWrite, Ready, Shared};
use super::mover::{self, Road, Wire};
use super::response::DataInLimits;
use super::session::Session;
use super::task::{CommandContext, CommandSlot};
use super::throttle::{after_wait, Throttle};
use super::Fabric;
use crate::copies::{CopyPath, Counts};

/// What a connection's commands are started with.
pub(super) struct Launcher {
    pub fabric: Arc<Fabric>,
    pub session: Arc<Session>,
    pub shared: Arc<Shared>,
    /// The connection's writer queue.
    pub tx: mpsc::Sender<Outgoing>,
    pub limits: DataInLimits,
    /// Data-In goes by RDMA Write (iSER): the initiator's
    /// MaxRecvDataSegmentLength does not size it (RFC 7145 §6.3).
    data_in_by_rdma: bool,
    /// DataPDUInOrder as negotiated (No lets Data-In leave in completion
    /// order).
    pub data_pdu_in_order: bool,
    /// Double-buffered WRITEs running (see [`super::syncwrite`]).
    pub sync_writes: super::syncwrite::Running,
    /// Reset answers waiting for other sessions' commands, to be queued
    /// beside the connection (see [`Launcher::answer_when_settled`]).
    answers_pending: Arc<tokio::sync::watch::Sender<usize>>,
    /// Bytes the connection's writer has sent (see
    /// [`super::send_stall`]): while they move, a full queue is a slow
    /// link, not a stalled initiator. Nothing counts them over iSER, whose
    /// full queue therefore ends the connection after one NOP timeout.
    pub writer_progress: Arc<std::sync::atomic::AtomicU64>,
}

impl Launcher {
    /// The launcher of `machine`'s commands, queueing to the writer `tx`.
    pub fn new(
        fabric: &Arc<Fabric>,
        session: &Arc<Session>,
        machine: &ConnMachine,
        tx: mpsc::Sender<Outgoing>,
    ) -> Launcher {
        Launcher {
            fabric: fabric.clone(),
            session: session.clone(),
            shared: machine.shared().clone(),
            tx,
            limits: machine.data_in_limits(),
            data_in_by_rdma: false,
            data_pdu_in_order: machine.data_pdu_in_order(),
            sync_writes: Default::default(),
            answers_pending: Arc::new(tokio::sync::watch::Sender::new(0)),
            writer_progress: Arc::default(),
        }
    }

    /// Queues `answer` (a reset's) once the commands running on the reset
    /// units have ended, from a task of its own: the connection goes on
    /// reading meanwhile.
    pub fn answer_when_settled(&self, settling: crate::scsi::Settling, answer: Pdu) {
        let (tx, settle) = (self.tx.clone(), self.settle(settling));
        let pending = self.answers_pending.clone();
        pending.send_modify(|n| *n += 1);
        tokio::spawn(async move {
            settle.await;
            // A connection gone meanwhile takes no answer.
            let _ = tx.send(Outgoing::Pdu(answer)).await;
            pending.send_modify(|n| *n -= 1);
        });
    }

    /// Waits (bounded) until every answer of [`Launcher::answer_when_settled`]
    /// is queued: a Logout Response must follow them (RFC 7143 §11.14:
    /// nothing of the connection's tasks after it).
    pub async fn answers_queued(&self) {
        let mut rx = self.answers_pending.subscribe();
        let limit = SETTLE_LIMIT + Duration::from_secs(2);
        let _ = tokio::time::timeout(limit, rx.wait_for(|n| *n == 0)).await;
    }

    /// Data-In becomes RDMA Writes (iSER): MaxRecvDataSegmentLength does
    /// not apply (RFC 7145 §6.3), so each burst is one write, whatever a
    /// Text exchange declares later.
    pub fn send_data_in_by_rdma(&mut self) {
        self.data_in_by_rdma = true;
        self.limits.max_recv_data_segment_length = self.limits.max_burst_length;
    }

    /// The initiator declared a new MaxRecvDataSegmentLength in a Text
    /// exchange (RFC 7143 §13.12 allows it in full feature phase): the
    /// commands started from now on cut their Data-In to it.
    pub fn renegotiated(&mut self, limits: DataInLimits) {
        if !self.data_in_by_rdma {
            self.limits = limits;
        }
    }

    /// What a task of `cmd` in this (normal) session needs from the
    /// connection; `slot` is its window slot, registered as a task.
    fn context(
        &self,
        cmd: blockwire_pdu::pdu::ScsiCommand,
        cdb: Vec<u8>,
        slot: CommandSlot,
    ) -> CommandContext {
        let aborted = slot
            .abort_flag()
            .cloned()
            .unwrap_or_else(|| Arc::new(std::sync::atomic::AtomicBool::new(true)));
        let target = self
            .session
            .target
            .as_ref()
            .expect("normal session has a target");
        CommandContext {
            cmd,
            cdb,
            luns: target.luns.clone(),
            nexus: self
                .session
                .nexus
                .clone()
                .expect("normal session has a nexus"),
            session: self.session.clone(),
            shared: self.shared.clone(),
            tx: self.tx.clone(),
            limits: self.limits,
            aborted,
            slot,
        }
    }

    /// Runs a command whose data is here: WRITE data RDMA-Read first when
    /// offloaded, READ data by the road and wire [`mover::choose`] picks.
    pub fn run(&self, ready: Ready) {
        let Ready {
            cmd,
            cdb,
            r2t_count,
            data_out,
            offload,
            budget,
            throttle,
            slot,
        } = ready;
        let target = self
            .session
            .target
            .clone()
            .expect("normal session has a target");
        let route = mover::choose(&self.fabric, &target.name, &cmd, &cdb, offload);
        let ctx = Arc::new(self.context(cmd, cdb, slot));
        // A command its LUN's QoS ceilings hold back starts on its road
        // when its place comes (see `super::throttle`).
        let go = Go {
            throttle,
            aborted: ctx.aborted.clone(),
        };
        match route.road {
            Road::Core
                if matches!(route.wire, Wire::Tcp)
                    && ctx.cmd.write
                    && !ctx.cmd.read
                    && data_out.len() as u64 <= mover::WRITE_ON_TASK_MAX =>
            {
                go.start(mover::write_road(ctx, data_out, budget, r2t_count));
            }
            Road::Core
                if matches!(route.wire, Wire::Tcp)
                    && ctx.cmd.read
                    && !ctx.cmd.write
                    && u64::from(ctx.cmd.expected_data_transfer_length)
                        <= mover::MEMORY_READ_ON_TASK_MAX =>
            {
                go.start(mover::memory_road(ctx, data_out, budget, r2t_count));
            }
            Road::Core => {
                // Copied out of the read buffer it may pin (see on_task_or_core).
                go.start(mover::core_road(
                    ctx,
                    route.wire,
                    data_out.into(),
                    budget,
                    r2t_count,
                ));
            }
            Road::File(lun) => {
                go.start(super::sendfile::serve(ctx, lun));
            }
            Road::Engine(path) => {
                let job = super::syncread::ReadJob {
                    ctx,
                    path: path.clone(),
                    data_pdu_in_order: self.data_pdu_in_order,
                    received: std::time::Instant::now(),
                };
                match route.wire {
                    Wire::Tcp => {
                        // Debug copy counter: the engine reads into
                        // registered buffers (a kernel copy unless
                        // O_DIRECT). A --no-net READ counts itself
                        // (CopyPath::NoNet).
                        self.shared.copies.begin(
                            cmd.itt,
                            CopyPath::Engine,
                            Counts::default(),
                            !path.direct,
                        );
                        let m = mover::DataIn::engine(path);
                        go.start(super::syncread::serve(job, m));
                    }
                    Wire::NoNet => {
                        let m = mover::Discard {
                            buffered: !path.direct,
                        };
                        go.start(super::syncread::serve(job, m));
                    }
                    Wire::Rdma(p) => {
                        let m = mover::RdmaWrite::new(p);
                        go.start(super::syncread::serve(job, m));
                    }
                }
            }
        }
    }

    /// Starts a double-buffered WRITE's task.
    pub fn start_piped_write(&self, w: PipedWrite) {
        let throttle = w.throttle;
        let job = super::syncwrite::WriteJob {
            ctx: Arc::new(self.context(w.cmd, w.cdb, w.slot)),
            path: w.path,
            budget: w.budget,
            fabric: self.fabric.clone(),
        };
        super::syncwrite::spawn(job, w.lease, w.feed, &self.sync_writes, throttle);
    }

    /// Waits (on the blocking pool, at most [`SETTLE_LIMIT`]) for the
    /// commands running on reset units at the reset to end: a future of
    /// its own, so a task beside the connection can wait too.
    pub fn settle(
        &self,
        settling: crate::scsi::Settling,
    ) -> impl Future<Output = ()> + Send + 'static {
        let tsih = self.session.tsih;
        async move {
            let waited = tokio::task::spawn_blocking(move || settling.wait(SETTLE_LIMIT)).await;
            match waited {
                Ok(busy) if busy.is_empty() => {}
                Ok(busy) => tracing::warn!(
                    tsih,
                    luns = ?busy,
                    "reset answered with commands still running on these LUNs after {}s",
                    SETTLE_LIMIT.as_secs()
                ),
                Err(e) => tracing::error!(error = %e, "waiting for the reset's commands"),
            }
        }
    }

    /// Waits, at most 5 s, until the aborted pipelined WRITEs among
    /// `aborted` ended their chunk writes (so none lands after the
    /// initiator hears of the abort) and the `completing` tasks queued
    /// their answers (so the task management response follows them), and
    /// the aborted commands the core was running when the abort came that
    /// may change the medium (`changing_medium`, see
    /// [`super::task::CommandContext::in_core`]) returned, as the pipelined
    /// ones' chunk writes do. The connection reads nothing meanwhile, so
    /// the bound is short; past it the abort is answered, and logged.
    pub async fn await_aborted(
        &self,
        aborted: &[u32],
        completing: &[u32],
        changing_medium: &[Arc<std::sync::atomic::AtomicUsize>],
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        self.sync_writes.wait_drained(aborted, deadline).await;
        for itt in completing {
            while self.session.tasks.contains(*itt) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let running = super::session::await_medium_settled(changing_medium, left).await;
        if running > 0 {
            tracing::warn!(
                tsih = self.session.tsih,
                commands = running,
                "abort answered with aborted commands still in the backstore after 5s"
            );
        }
    }
}

/// How long a reset's response waits for the commands of other sessions
/// still running on the reset units: past it (a backstore that stopped
/// answering) the reset is answered anyway, and logged, before open-iscsi
/// gives the reset up (`lu_reset_timeout`, 30 s) and escalates.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// How a command goes on its road: at once, or after the wait its LUN's
/// QoS ceilings booked for it (see [`super::throttle`]).
struct Go {
    throttle: Option<Throttle>,
    aborted: Arc<std::sync::atomic::AtomicBool>,
}

impl Go {
    fn start(self, road: impl Future<Output = ()> + Send + 'static) {
        match self.throttle {
            None => start(road),
            Some(t) => start(after_wait(Some(t), self.aborted, road)),
        }
    }
}

/// Starts a command's task: its future is polled once right here, on the
/// connection's reader, and becomes a tokio task only if it has to wait
/// (a blocking-pool step, a full writer queue, an engine read). Most small
/// commands (a READ planned and queued to the writer, a RAM or small WRITE
/// the core answers at once) end in that first poll, which saves a task
/// spawn and the wake-up of another worker thread per command. The future
/// is polled again by its task, with the task's waker, so what it waits
/// for wakes it there.
///
/// A panic in that first poll ends the command only, as it would in a task
/// of its own: its slot is released as the future is dropped.
fn start(fut: impl Future<Output = ()> + Send + 'static) {
    let mut fut = Box::pin(fut);
    let mut cx = Context::from_waker(Waker::noop());
    match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx))) {
        Ok(Poll::Ready(())) => {}
        Ok(Poll::Pending) => {
            tokio::spawn(fut);
        }
        Err(_) => tracing::error!("a SCSI command's task panicked; the command is dropped"),
    }
}

#[cfg(test)]
mod tests {
    use super::start;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// Set when dropped: stands for a command's slot, released with its
    /// future whatever way the future ends.
    struct Slot(Arc<AtomicBool>);

    impl Drop for Slot {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_command_that_need_not_wait_ends_before_start_returns() {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        start(async move { d.store(true, Ordering::SeqCst) });
        assert!(done.load(Ordering::SeqCst), "ran on the caller, to its end");
    }

    #[tokio::test]
    async fn a_command_that_waits_goes_on_in_a_task_of_its_own() {
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<u32>();
        let (out_tx, out_rx) = tokio::sync::oneshot::channel::<u32>();
        let started = Arc::new(AtomicBool::new(false));
        let s = started.clone();
        start(async move {
            s.store(true, Ordering::SeqCst);
            let v = go_rx.await.expect("sender kept");
            out_tx.send(v + 1).expect("receiver kept");
        });
        assert!(started.load(Ordering::SeqCst), "its first step ran at once");
        // What it waits for wakes the task it now runs in.
        go_tx.send(41).unwrap();
        let v = tokio::time::timeout(Duration::from_secs(5), out_rx)
            .await
            .expect("the waiting command ends")
            .unwrap();
        assert_eq!(v, 42);
    }

    #[tokio::test]
    async fn a_command_that_panics_at_once_is_dropped_and_its_slot_released() {
        let released = Arc::new(AtomicBool::new(false));
        let slot = Slot(released.clone());
        start(async move {
            let _slot = slot;
            panic!("a bug in a SCSI command");
        });
        assert!(released.load(Ordering::SeqCst));
    }
}
