//! iSER initiator (RFC 7145): iSCSI over an RDMA reliable connection.
//!
//! [`IserSession`] connects through RDMA CM to an iSER portal (blockwire's, LIO's
//! `ib_isert`, any RFC 7145 target), logs in with RDMAExtensions=Yes over Send/Recv, and
//! then runs commands through the same sans-IO [`Engine`] as the TCP session. Every
//! message is an RDMA Send of the 28-byte iSER header and one iSCSI PDU, without digests
//! (RFC 7145 §5.1: the RDMA fabric protects the data). Data never travels in PDUs:
//! - a READ advertises its registered buffer as the read STag in the command's iSER
//!   header; the target RDMA-Writes the data there and sends only the SCSI Response;
//! - a WRITE advertises the write STag; with ImmediateData=No and InitialR2T=Yes every
//!   byte is solicited, and the target RDMA-Reads it (RFC 7145 §7.3.4: no R2T reaches the
//!   initiator).
//!
//! A command's registration is released when the command ends, so its STag stops
//! working; the registration layer's strategies (dynamic, pin-down cache, FMRD, arena)
//! apply as for RDMA-assisted sessions.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockwire_pdu::iser::{IserHeader, RemoteBuffer, ISER_HEADER_LEN};
use blockwire_pdu::keys::SessionParams;
use blockwire_pdu::pdu::codes::LogoutResponseCode;
use blockwire_pdu::{Bhs, Digests, Pdu};
use blockwire_transport::rdma::any::{AnyCq, AnyPd, AnyProvider, AnyQp};
use blockwire_transport::rdma::{
    AccessFlags, AlignedBuf, CompletionQueue, MemoryRegion, ProtectionDomain, QpCaps, QpInit,
    QueuePair, RdmaProvider, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};
use blockwire_transport::reg::IoSpace;
use rand::RngCore;
use tokio::sync::{oneshot, Notify, Semaphore};

use crate::config::InitiatorConfig;
use crate::engine::{Engine, Event, Limits, TaskResult};
use crate::error::{Error, Result};
use crate::isid::isid_for;
use crate::login::{LoginMachine, LoginStep};
use crate::rdma::{RdmaBuf, RdmaConfig};
use crate::retry::Retries;
use crate::session::{all_blocks_moved, scsi_completion, Completion};

/// What one of our posted receives holds in a data segment (InitiatorRecvDataSegmentLength).
pub const INITIATOR_RECV_DATA_SEGMENT_LENGTH: u32 = 8192;
/// One message buffer: iSER header, BHS, room for AHS, the data segment.
const MSG_LEN: usize = 16 << 10;
/// Receives posted at once (the target's unexpected PDUs and responses land here).
const RECVS: usize = 64;
/// Send buffers (messages in flight at once).
const SENDS: usize = 64;
/// RFC 7145 §9.2, iSER CM REQ private data: the initiator does not use zero-based
/// virtual addresses (ZBVA_NOT_SUP, 0x80) nor Send with Invalidate (SEND_W_INV_NOT_SUP,
/// 0x40).
const CM_REQ: [u8; 4] = [0xc0, 0, 0, 0];

/// Counters of one iSER session's messages and RDMA registrations.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IserStats {
    /// RDMA Sends posted (login, commands, NOP-Out, logout).
    pub sends: u64,
    /// Messages received (login responses, SCSI responses, NOP-In, others).
    pub receives: u64,
    /// SCSI commands whose data moved by RDMA (READ by the target's RDMA Write, WRITE by
    /// its RDMA Read).
    pub rdma_commands: u64,
}

#[derive(Default)]
struct Counters {
    sends: AtomicU64,
    receives: AtomicU64,
    rdma_commands: AtomicU64,
}

type Owner = Arc<Mutex<Option<oneshot::Sender<TaskResult>>>>;

/// A logged-in iSER session with one target.
pub struct IserSession {
    inner: Arc<Inner>,
    receiver: tokio::task::JoinHandle<()>,
    pump: tokio::task::JoinHandle<()>,
}

struct Inner {
    target: String,
    qp: AnyQp,
    sends: SendRing,
    receives: <AnyPd as ProtectionDomain>::Mr,
    waiters: Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>,
    next_wr: AtomicU64,
    engine: Mutex<Engine<Owner>>,
    window: Notify,
    slots: Semaphore,
    space: IoSpace<AnyPd>,
    params: SessionParams,
    tsih: u16,
    lost: AtomicBool,
    /// [`InitiatorConfig::command_timeout`]: a READ, WRITE or SYNCHRONIZE
    /// CACHE unanswered past its deadline gives the connection up.
    command_timeout: Option<Duration>,
    counters: Counters,
    /// Answers to the target's NOP-In pings on their way out (bounded as
    /// on TCP).
    ping_answers: crate::session::PingAnswers,
    _provider: AnyProvider,
}

/// Registered send buffers, each used by one message until its Send completes.
struct SendRing {
    mr: <AnyPd as ProtectionDomain>::Mr,
    free: Mutex<Vec<usize>>,
    available: Semaphore,
}

fn rdma_err(e: blockwire_transport::rdma::RdmaError) -> Error {
    Error::Protocol(format!("iSER: {e}"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One received message: its iSER header and PDU. Lengths come from the wire and are
/// checked by the decoders; trailing bytes after the PDU are refused.
pub fn parse_message(msg: &[u8]) -> Result<(IserHeader, Pdu)> {
    let header =
        IserHeader::decode(msg).map_err(|e| Error::Protocol(format!("iSER header: {e}")))?;
    let rest = &msg[ISER_HEADER_LEN.min(msg.len())..];
    let (pdu, used) = Pdu::decode(rest, Digests::NONE)
        .map_err(|e| Error::Protocol(format!("iSCSI PDU in an iSER message: {e}")))?;
    if used != rest.len() {
        return Err(Error::Protocol(format!(
            "{} bytes after the PDU in one iSER message",
            rest.len() - used
        )));
    }
    Ok((header, pdu))
}

impl IserSession {
    /// Connects to the iSER portal `portal` (an address of the target's RDMA device) with
    /// `rdma`'s backend and registration strategy, and logs in to `target`.
    pub async fn connect(
        config: InitiatorConfig,
        rdma: RdmaConfig,
        portal: SocketAddr,
        target: &str,
    ) -> Result<IserSession> {
        if config.queue_depth == 0 {
            return Err(Error::Config("queue depth must be at least 1".into()));
        }
        let provider = AnyProvider::open(rdma.backend, rdma.device.as_deref()).map_err(|e| {
            Error::Config(format!(
                "iSER needs an RDMA device ({} backend): {e}",
                rdma.backend.name()
            ))
        })?;
        let pd = provider.alloc_pd().map_err(rdma_err)?;
        let send_cq = provider.create_cq(SENDS * 2).map_err(rdma_err)?;
        let recv_cq = provider.create_cq(RECVS * 2).map_err(rdma_err)?;
        let init = QpInit::<AnyProvider> {
            pd: pd.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            caps: QpCaps {
                max_send_wr: SENDS as u32,
                max_recv_wr: RECVS as u32,
                max_sge: 4,
            },
        };
        let receives = pd
            .register(AlignedBuf::new(RECVS * MSG_LEN), AccessFlags::LOCAL_WRITE)
            .map_err(rdma_err)?;
        let sends = SendRing {
            mr: pd
                .register(AlignedBuf::new(SENDS * MSG_LEN), AccessFlags::LOCAL_WRITE)
                .map_err(rdma_err)?,
            free: Mutex::new((0..SENDS).collect()),
            available: Semaphore::new(SENDS),
        };
        let space = IoSpace::new(&pd, rdma.registration).map_err(rdma_err)?;
        let qp = tokio::time::timeout(
            rdma.connect_timeout,
            provider.connect(portal, init, &CM_REQ),
        )
        .await
        .map_err(|_| Error::Timeout(format!("iSER connection to {portal}")))?
        .map_err(|e| Error::Protocol(format!("iSER connection to {portal}: {e}")))?;
        for i in 0..RECVS {
            post_receive(&qp, &receives, i)?;
        }
        let mut conn = Conn {
            qp,
            sends,
            receives,
            waiters: Mutex::new(HashMap::new()),
            next_wr: AtomicU64::new(1),
            send_cq,
            recv_cq,
        };
        let outcome =
            tokio::time::timeout(config.login_timeout, conn.login(&config, target, portal))
                .await
                .map_err(|_| {
                    Error::Timeout(format!(
                        "iSER login to {target} at {portal} took longer than {:?}",
                        config.login_timeout
                    ))
                })??;
        let limits = Limits::from_params(&outcome.params);
        let engine = Engine::new(
            1,
            limits,
            outcome.exp_cmd_sn,
            outcome.exp_cmd_sn,
            outcome.max_cmd_sn,
            outcome.stat_sn,
        );
        let Conn {
            qp,
            sends,
            receives,
            waiters,
            next_wr,
            send_cq,
            recv_cq,
        } = conn;
        let inner = Arc::new(Inner {
            target: target.to_owned(),
            qp,
            sends,
            receives,
            waiters,
            next_wr,
            engine: Mutex::new(engine),
            window: Notify::new(),
            slots: Semaphore::new(config.queue_depth),
            space,
            params: outcome.params.clone(),
            tsih: outcome.tsih,
            lost: AtomicBool::new(false),
            command_timeout: config.command_timeout,
            counters: Counters::default(),
            ping_answers: Default::default(),
            _provider: provider,
        });
        // Login's messages count too.
        inner.counters.sends.store(outcome.sends, Ordering::Relaxed);
        inner
            .counters
            .receives
            .store(outcome.sends, Ordering::Relaxed);
        let pump = tokio::spawn(send_completions(Arc::downgrade(&inner), send_cq));
        let receiver = tokio::spawn(receive_loop(inner.clone(), recv_cq));
        tracing::debug!(%portal, target, tsih = outcome.tsih, "iSER login complete");
        Ok(IserSession {
            inner,
            receiver,
            pump,
        })
    }

    /// The target's name.
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// The TSIH the target assigned.
    pub fn tsih(&self) -> u16 {
        self.inner.tsih
    }

    /// The negotiated parameters (RDMAExtensions=Yes, no digests).
    pub fn params(&self) -> &SessionParams {
        &self.inner.params
    }

    /// A zeroed buffer of `len` bytes the target can reach by RDMA.
    pub fn alloc(&self, len: usize) -> Result<RdmaBuf> {
        self.inner.space.alloc(len).map_err(rdma_err)
    }

    /// Message and command counters.
    pub fn stats(&self) -> IserStats {
        let c = &self.inner.counters;
        IserStats {
            sends: c.sends.load(Ordering::Relaxed),
            receives: c.receives.load(Ordering::Relaxed),
            rdma_commands: c.rdma_commands.load(Ordering::Relaxed),
        }
    }

    /// The registration layer's counters.
    pub fn registration_stats(&self) -> blockwire_transport::reg::RegStats {
        self.inner.space.stats()
    }

    /// READ(16) of `blocks` blocks at `lba` into `buf` (its length is the transfer length).
    pub async fn read(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        buf: &mut RdmaBuf,
    ) -> Result<Completion> {
        let cdb = crate::scsi::rw16(false, lba, blocks, false);
        let asked = buf.len();
        let done = self.execute(lun, &cdb, Some(buf), None).await?;
        all_blocks_moved(done, "READ(16)", lun, lba, blocks, asked)
    }

    /// WRITE(16) of `buf` at `lba`.
    pub async fn write(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        buf: &RdmaBuf,
    ) -> Result<Completion> {
        let cdb = crate::scsi::rw16(true, lba, blocks, false);
        let done = self.execute(lun, &cdb, None, Some(buf)).await?;
        all_blocks_moved(done, "WRITE(16)", lun, lba, blocks, buf.len())
    }

    /// A command without data (TEST UNIT READY, SYNCHRONIZE CACHE, ...).
    pub async fn command(&self, lun: u16, cdb: &[u8]) -> Result<Completion> {
        self.execute(lun, cdb, None, None).await
    }

    /// Any command; `read` receives Data-In by RDMA Write, `write` is RDMA-Read by the
    /// target. UNIT ATTENTION, BUSY and TASK SET FULL are retried as
    /// [`crate::Session::execute`] retries them ([`crate::retry`]).
    pub async fn execute(
        &self,
        lun: u16,
        cdb: &[u8],
        read: Option<&mut RdmaBuf>,
        write: Option<&RdmaBuf>,
    ) -> Result<Completion> {
        if cdb.is_empty() || cdb.len() > 16 {
            return Err(Error::Config(format!("CDB of {} bytes", cdb.len())));
        }
        let mut cdb16 = [0u8; 16];
        cdb16[..cdb.len()].copy_from_slice(cdb);
        let mut retries = Retries::default();
        loop {
            match self.execute_once(lun, &cdb16, read.as_deref(), write).await {
                Err(e) if retries.again_after(&e).await => {}
                r => return r,
            }
        }
    }

    async fn execute_once(
        &self,
        lun: u16,
        cdb: &[u8; 16],
        read: Option<&RdmaBuf>,
        write: Option<&RdmaBuf>,
    ) -> Result<Completion> {
        let inner = &self.inner;
        let _permit = inner.slots.acquire().await.map_err(|_| Error::Closed)?;
        // The command's buffer, registered for the target's one-sided access; one
        // contiguous region, as an iSER header names one STag per direction.
        let buf = read.or(write);
        let reg = match buf {
            Some(b) => Some(
                inner
                    .space
                    .register_sg([b], u64::from(u32::MAX))
                    .map_err(rdma_err)?,
            ),
            None => None,
        };
        let one_region = reg.as_ref().map(|r| match r.remote()[..] {
            [one] => Some(RemoteBuffer {
                stag: one.rkey,
                base_offset: one.addr,
            }),
            _ => None,
        });
        let advertised = match one_region {
            Some(Some(b)) => Some(b),
            Some(None) => {
                if let Some(r) = reg {
                    let _ = r.release();
                }
                return Err(Error::Config(
                    "an iSER command's buffer must register as one region; \
                     use the arena or pin-down cache strategy"
                        .into(),
                ));
            }
            None => None,
        };
        let read_len = read.map_or(0, |b| b.len());
        let write_len = write.map_or(0, |b| b.len());
        let header = IserHeader::Control {
            write: if write.is_some() { advertised } else { None },
            read: if read.is_some() { advertised } else { None },
        };
        let (tx, rx) = oneshot::channel();
        let owner: Owner = Arc::new(Mutex::new(Some(tx)));
        let r = async {
            loop {
                if inner.lost.load(Ordering::Acquire) {
                    return Err(Error::Closed);
                }
                let notified = inner.window.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let started = {
                    let mut eng = lock(&inner.engine);
                    eng.window_open().then(|| {
                        eng.start_scsi_offloaded(lun, cdb, read_len, write_len, owner.clone())
                    })
                };
                if let Some((_, command)) = started {
                    inner
                        .send(header, &Pdu::new(Bhs::ScsiCommand(command)))
                        .await?;
                    break;
                }
                let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
            }
            let deadline = inner
                .command_timeout
                .and_then(|t| crate::session::deadline_of(cdb[0], t));
            let result = match deadline {
                Some(d) => match tokio::time::timeout(d, rx).await {
                    Ok(answer) => answer.map_err(|_| Error::Closed)?,
                    // Unlike on TCP, the command is not aborted and sent
                    // again on the same connection: until it ends, its
                    // buffer is the target's to RDMA Write or Read. The
                    // connection goes down first, so none can reach it
                    // once the caller has it back.
                    Err(_) => {
                        let why = format!("no answer to SCSI command {:#04x} within {d:?}", cdb[0]);
                        inner.connection_lost(&why);
                        return Err(Error::Timeout(why));
                    }
                },
                None => rx.await.map_err(|_| Error::Closed)?,
            };
            let mut none = None;
            let mut c = scsi_completion(lun, cdb[0], 0, write_len, result, &mut none)?;
            if read_len > 0 {
                c.transferred = match c.residual {
                    crate::Residual::Underflow(n) => read_len.saturating_sub(n as usize),
                    _ => read_len,
                };
            }
            Ok(c)
        }
        .await;
        // The command is over: its STag stops working.
        if let Some(reg) = reg {
            reg.release().map_err(rdma_err)?;
            if r.is_ok() {
                inner.counters.rdma_commands.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }

    /// Logs out (reason: close the session) and closes the RDMA connection.
    pub async fn logout(self) -> Result<()> {
        let inner = self.inner.clone();
        let (tx, rx) = oneshot::channel();
        let owner: Owner = Arc::new(Mutex::new(Some(tx)));
        let request = lock(&inner.engine).start_logout(owner);
        // The Send's completion does not decide the outcome: a target that answers and
        // closes at once (RFC 7143 §11.14) may do so before its adapter acknowledges
        // the request, whose Send is then flushed although the target received it. The
        // response decides. Without one, the receive queue's flush (which follows any
        // response in completion order) fails the logout as a lost connection.
        let sent = inner
            .send_and_wait(
                IserHeader::Control {
                    write: None,
                    read: None,
                },
                &Pdu::new(Bhs::LogoutRequest(request)),
            )
            .await;
        let outcome = match sent {
            Ok(sent) => (
                tokio::time::timeout(Duration::from_secs(10), rx).await,
                sent,
            ),
            Err(never_posted) => {
                self.close();
                return Err(never_posted);
            }
        };
        self.close();
        match outcome {
            (Ok(Ok(TaskResult::Logout(LogoutResponseCode::Closed, _))), _) => Ok(()),
            (_, Err(e)) => Err(e),
            (Ok(Ok(other)), Ok(())) => Err(Error::Protocol(format!("logout answered {other:?}"))),
            (Ok(Err(_)), Ok(())) => Err(Error::Closed),
            (Err(_), Ok(())) => Err(Error::Timeout("iSER logout".into())),
        }
    }

    fn close(&self) {
        self.inner.lost.store(true, Ordering::Release);
        self.inner.qp.disconnect();
        self.receiver.abort();
        self.pump.abort();
    }
}

impl Drop for IserSession {
    fn drop(&mut self) {
        self.close();
    }
}

/// The connection before the session exists: login runs on it.
struct Conn {
    qp: AnyQp,
    sends: SendRing,
    receives: <AnyPd as ProtectionDomain>::Mr,
    waiters: Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>,
    next_wr: AtomicU64,
    send_cq: AnyCq,
    recv_cq: AnyCq,
}

struct LoginDone {
    params: SessionParams,
    tsih: u16,
    stat_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    /// Login Requests sent (each answered by one Login Response).
    sends: u64,
}

impl Conn {
    async fn login(
        &mut self,
        config: &InitiatorConfig,
        target: &str,
        portal: SocketAddr,
    ) -> Result<LoginDone> {
        let isid = isid_for(&config.initiator_name, config.isid_qualifier);
        let mut machine = LoginMachine::new_iser(
            config,
            target,
            isid,
            INITIATOR_RECV_DATA_SEGMENT_LENGTH,
            Box::new(|b: &mut [u8]| rand::thread_rng().fill_bytes(b)),
        )?;
        let mut pdu = machine.start()?;
        let mut sends = 0;
        loop {
            tracing::debug!(%portal, bhs = ?pdu.bhs, text = %String::from_utf8_lossy(&pdu.data).replace('\0', " "), "iSER Login Request");
            self.send_during_login(&pdu).await?;
            sends += 1;
            let msg = self.receive_during_login().await?;
            let (_, response) = parse_message(&msg)?;
            tracing::debug!(%portal, bhs = ?response.bhs, text = %String::from_utf8_lossy(&response.data).replace('\0', " "), "iSER Login Response");
            match machine.receive(response) {
                Ok(LoginStep::Send(next)) => pdu = next,
                Ok(LoginStep::Done(o)) => {
                    if !o.params.rdma_extensions {
                        return Err(Error::Protocol(format!(
                            "{target} at {portal} did not accept RDMAExtensions=Yes: not an iSER target"
                        )));
                    }
                    return Ok(LoginDone {
                        params: o.params,
                        tsih: o.tsih,
                        stat_sn: o.stat_sn,
                        exp_cmd_sn: o.exp_cmd_sn,
                        max_cmd_sn: o.max_cmd_sn,
                        sends,
                    });
                }
                // A redirection is not followed here: the response does
                // not say whether the address is a TCP or an iSER portal.
                Err(e) => return Err(e.at_portal(&portal.to_string())),
            }
        }
    }

    async fn send_during_login(&self, pdu: &Pdu) -> Result<()> {
        let slot = self.sends.take().await?;
        let msg = message(
            IserHeader::Control {
                write: None,
                read: None,
            },
            pdu,
        )?;
        let r = post_send(
            &self.qp,
            &self.sends,
            slot,
            &msg,
            &self.waiters,
            &self.next_wr,
        );
        let r = match r {
            Ok(rx) => {
                // No completion pump yet: wait for this Send's completion here.
                let c = self.send_cq.next().await.map_err(rdma_err)?;
                drop(rx);
                if c.status == WcStatus::Success {
                    Ok(())
                } else {
                    Err(Error::Protocol(format!(
                        "login Send completed with {:?}",
                        c.status
                    )))
                }
            }
            Err(e) => Err(e),
        };
        lock(&self.waiters).clear();
        self.sends.give(slot);
        r
    }

    async fn receive_during_login(&self) -> Result<Vec<u8>> {
        let c = self.recv_cq.next().await.map_err(rdma_err)?;
        if c.status != WcStatus::Success {
            return Err(Error::Protocol(format!(
                "the iSER connection failed during login ({:?})",
                c.status
            )));
        }
        take_message(
            &self.qp,
            &self.receives,
            c.wr_id as usize,
            c.byte_len as usize,
        )
    }
}

impl SendRing {
    async fn take(&self) -> Result<usize> {
        self.available
            .acquire()
            .await
            .map_err(|_| Error::Closed)?
            .forget();
        Ok(lock(&self.free).pop().expect("a permit means a free slot"))
    }

    fn give(&self, slot: usize) {
        lock(&self.free).push(slot);
        self.available.add_permits(1);
    }
}

/// The bytes of one message: the iSER header, then the PDU without digests.
fn message(header: IserHeader, pdu: &Pdu) -> Result<Vec<u8>> {
    let mut msg = header.encode().to_vec();
    pdu.encode_into(&mut msg, Digests::NONE);
    if msg.len() > MSG_LEN {
        return Err(Error::Protocol(format!(
            "an iSER message of {} bytes exceeds the {MSG_LEN}-byte buffer",
            msg.len()
        )));
    }
    Ok(msg)
}

fn post_send(
    qp: &AnyQp,
    ring: &SendRing,
    slot: usize,
    msg: &[u8],
    waiters: &Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>,
    next_wr: &AtomicU64,
) -> Result<oneshot::Receiver<WcStatus>> {
    ring.mr.write_at(slot * MSG_LEN, msg).map_err(rdma_err)?;
    let sge = ring
        .mr
        .sge(slot * MSG_LEN, msg.len())
        .ok_or_else(|| Error::Protocol("send buffer out of range".into()))?;
    let wr_id = next_wr.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    lock(waiters).insert(wr_id, tx);
    qp.post_send(SendWr {
        wr_id,
        op: SendOp::Send,
        sgl: vec![sge],
        signaled: true,
    })
    .map_err(|e| {
        lock(waiters).remove(&wr_id);
        rdma_err(e)
    })?;
    Ok(rx)
}

fn post_receive(qp: &AnyQp, mr: &<AnyPd as ProtectionDomain>::Mr, i: usize) -> Result<()> {
    let sge = mr
        .sge(i * MSG_LEN, MSG_LEN)
        .ok_or_else(|| Error::Protocol("receive buffer out of range".into()))?;
    qp.post_recv(RecvWr {
        wr_id: i as u64,
        sgl: vec![sge],
    })
    .map_err(rdma_err)
}

/// Copies out received message `i` (`len` bytes, bounded by the buffer) and posts its
/// buffer again.
fn take_message(
    qp: &AnyQp,
    mr: &<AnyPd as ProtectionDomain>::Mr,
    i: usize,
    len: usize,
) -> Result<Vec<u8>> {
    if i >= RECVS {
        return Err(Error::Protocol(format!(
            "completion for unknown receive {i}"
        )));
    }
    let mut m = vec![0u8; len.min(MSG_LEN)];
    mr.read_at(i * MSG_LEN, &mut m).map_err(rdma_err)?;
    post_receive(qp, mr, i)?;
    Ok(m)
}

impl Inner {
    /// Sends one message and waits for its Send to complete; a failed Send means the
    /// connection is lost.
    async fn send(&self, header: IserHeader, pdu: &Pdu) -> Result<()> {
        let r = self.send_and_wait(header, pdu).await.and_then(|sent| sent);
        if r.is_err() {
            self.connection_lost("a Send failed");
        }
        r
    }

    /// Sends one message and waits for its Send's completion. The outer error: the Send
    /// was never posted, so nothing reached the wire; the inner one: it was posted and
    /// did not complete successfully, which does not tell whether the peer received it.
    async fn send_and_wait(&self, header: IserHeader, pdu: &Pdu) -> Result<Result<()>> {
        let msg = message(header, pdu)?;
        let slot = self.sends.take().await?;
        let r = post_send(
            &self.qp,
            &self.sends,
            slot,
            &msg,
            &self.waiters,
            &self.next_wr,
        );
        let r = match r {
            Ok(completion) => Ok(match completion.await {
                Ok(WcStatus::Success) => Ok(()),
                Ok(s) => Err(Error::Protocol(format!("iSER Send completed with {s:?}"))),
                Err(_) => Err(Error::Closed),
            }),
            Err(e) => Err(e),
        };
        self.sends.give(slot);
        self.counters.sends.fetch_add(1, Ordering::Relaxed);
        r
    }

    fn connection_lost(&self, why: &str) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::warn!(target = %self.target, why, "iSER connection lost");
        }
        // Down before the commands fail: their buffers go back to their
        // callers, and a target still running a READ must not RDMA Write
        // into one afterwards (an arena's STag stays valid).
        self.qp.disconnect();
        for (owner, _) in lock(&self.engine).drain() {
            if let Some(tx) = lock(&owner).take() {
                let _ = tx.send(TaskResult::Failed {
                    reason: format!("iSER connection lost: {why}"),
                    buf: None,
                });
            }
        }
        self.window.notify_waiters();
    }
}

/// Resolves the waiters of Sends as their completions arrive.
async fn send_completions(inner: std::sync::Weak<Inner>, cq: AnyCq) {
    loop {
        let Ok(c) = cq.next().await else { return };
        let Some(inner) = inner.upgrade() else { return };
        if c.opcode == WcOpcode::Send || c.status != WcStatus::Success {
            if let Some(tx) = lock(&inner.waiters).remove(&c.wr_id) {
                let _ = tx.send(c.status);
            }
        }
    }
}

/// Takes the target's messages: responses complete their tasks, NOP-Ins are answered.
async fn receive_loop(inner: Arc<Inner>, cq: AnyCq) {
    loop {
        let c = match cq.next().await {
            Ok(c) => c,
            Err(e) => return inner.connection_lost(&format!("receive queue: {e}")),
        };
        if c.status != WcStatus::Success {
            return inner.connection_lost(&format!("receive completed with {:?}", c.status));
        }
        let msg = match take_message(
            &inner.qp,
            &inner.receives,
            c.wr_id as usize,
            c.byte_len as usize,
        ) {
            Ok(m) => m,
            Err(e) => return inner.connection_lost(&e.to_string()),
        };
        inner.counters.receives.fetch_add(1, Ordering::Relaxed);
        let pdu = match parse_message(&msg) {
            Ok((_, pdu)) => pdu,
            Err(e) => return inner.connection_lost(&e.to_string()),
        };
        let events = lock(&inner.engine).receive(pdu);
        inner.window.notify_waiters();
        for event in events {
            match event {
                Event::Complete { owner, result } => {
                    if let Some(tx) = lock(&owner).take() {
                        let _ = tx.send(result);
                    }
                }
                Event::Send(pdu) => {
                    let answer = match inner.ping_answers.take() {
                        Ok(answer) => answer,
                        Err(why) => return inner.connection_lost(&why),
                    };
                    let inner = inner.clone();
                    tokio::spawn(async move {
                        let none = IserHeader::Control {
                            write: None,
                            read: None,
                        };
                        let _ = inner.send(none, &pdu).await;
                        drop(answer);
                    });
                }
                // RFC 7145 §7.3.4: the target turns R2Ts into RDMA Reads; one on the wire
                // is a protocol error for this command, which the engine already refused.
                Event::R2t { .. } => {}
                Event::Drop { reason, .. } => return inner.connection_lost(&reason),
                // Over iSER the connection is recovered at once, as on a
                // loss (no drain and Logout exchange there): commands in
                // flight are issued again on the new connection.
                Event::LogoutRequested { .. } => {
                    return inner.connection_lost("the target asked for a logout")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the target sends, parsing a message never panics and never accepts
        /// trailing bytes or a length the buffer does not hold.
        #[test]
        fn parse_message_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok((_, pdu)) = parse_message(&bytes) {
                prop_assert!(pdu.data.len() <= bytes.len());
            }
        }

        /// A message we build parses back to the same header and PDU.
        #[test]
        fn message_round_trips(stag in any::<u32>(), va in any::<u64>(), itt in any::<u32>()) {
            let header = IserHeader::Control {
                write: None,
                read: Some(RemoteBuffer { stag, base_offset: va }),
            };
            let pdu = Pdu::new(Bhs::NopOut(blockwire_pdu::pdu::NopOut {
                immediate: true,
                lun: blockwire_pdu::Lun::default(),
                itt,
                ttt: blockwire_pdu::pdu::RESERVED_TAG,
                cmd_sn: 1,
                exp_stat_sn: 1,
            }));
            let msg = message(header, &pdu).unwrap();
            let (h, p) = parse_message(&msg).unwrap();
            prop_assert_eq!(h, header);
            prop_assert_eq!(p.bhs, pdu.bhs);
        }
    }
}
