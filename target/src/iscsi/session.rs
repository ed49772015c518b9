//! The session table: TSIH allocation, session reinstatement and the
//! state a session keeps across its (single) connection.
//!
//! blockwire negotiates MaxConnections=1, so a session has one connection
//! at a time. A login with the same InitiatorName and ISID and TSIH 0
//! reinstates the session (RFC 7143 §6.3.5): the old connection is told to
//! stop, its tasks are aborted, and a new session takes its place. A login
//! with a known TSIH and the same CID reinstates the connection: the new
//! connection takes over the session and its CmdSN window.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use blockwire_pdu::keys::SessionParams;
use tokio::sync::watch;

use crate::iscsi::catalog::TargetEntry;
use crate::scsi::ItNexus;

/// Why a session could not be created or joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// A nonzero TSIH names no session.
    #[error("no session with TSIH {0}")]
    DoesNotExist(u16),
    /// The session already has its one connection and this is another CID.
    #[error("session already has a connection (MaxConnections=1)")]
    TooManyConnections,
    /// Every TSIH is in use.
    #[error("out of sessions")]
    OutOfResources,
}

/// One logged-in session.
#[derive(Debug)]
pub struct Session {
    /// Target Session Identifying Handle.
    pub tsih: u16,
    /// Initiator Session ID.
    pub isid: [u8; 6],
    /// InitiatorName.
    pub initiator_name: String,
    /// The target (None for a discovery session).
    pub target: Option<Arc<TargetEntry>>,
    /// The I_T nexus (normal sessions).
    pub nexus: Option<ItNexus>,
    /// Negotiated parameters.
    pub params: SessionParams,
    /// CID of the current connection.
    cid: Mutex<u16>,
    /// Flips to true when the current connection must stop (reinstatement,
    /// target reset, shutdown of this session).
    stop: watch::Sender<u64>,
    /// Generation of the connection that currently owns the session.
    generation: Mutex<u64>,
}

impl Session {
    /// A receiver that changes when the connection with `generation` must stop.
    pub fn stop_signal(&self) -> watch::Receiver<u64> {
        self.stop.subscribe()
    }

    /// The generation a newly attached connection owns.
    pub fn generation(&self) -> u64 {
        *self.generation.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the current connection to stop.
    pub fn stop_connection(&self) {
        let mut g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        *g += 1;
        let _ = self.stop.send(*g);
    }

    /// Whether this session is a discovery session.
    pub fn is_discovery(&self) -> bool {
        self.target.is_none()
    }
}

/// All sessions of the fabric.
#[derive(Debug, Default)]
pub struct SessionTable {
    inner: Mutex<TableInner>,
}

#[derive(Debug, Default)]
struct TableInner {
    by_tsih: HashMap<u16, Arc<Session>>,
    last_tsih: u16,
}

/// A request to create or join a session, from a completed login.
#[derive(Debug, Clone)]
pub struct SessionRequest {
    /// InitiatorName.
    pub initiator_name: String,
    /// ISID.
    pub isid: [u8; 6],
    /// TSIH from the login (0: a new session).
    pub tsih: u16,
    /// CID.
    pub cid: u16,
    /// The target (None: discovery).
    pub target: Option<Arc<TargetEntry>>,
    /// Portal group tag the login came through.
    pub tpgt: u16,
    /// Negotiated parameters.
    pub params: SessionParams,
}

impl SessionTable {
    /// Creates a session, reinstating any with the same initiator, ISID and
    /// target, or joins an existing one (connection reinstatement).
    pub fn attach(&self, req: SessionRequest) -> Result<Arc<Session>, SessionError> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if req.tsih != 0 {
            let s = inner
                .by_tsih
                .get(&req.tsih)
                .cloned()
                .ok_or(SessionError::DoesNotExist(req.tsih))?;
            if s.isid != req.isid || !s.initiator_name.eq_ignore_ascii_case(&req.initiator_name) {
                return Err(SessionError::DoesNotExist(req.tsih));
            }
            let mut cid = s.cid.lock().unwrap_or_else(|e| e.into_inner());
            if *cid != req.cid {
                return Err(SessionError::TooManyConnections);
            }
            *cid = req.cid;
            drop(cid);
            s.stop_connection();
            return Ok(s);
        }
        // Session reinstatement: the same I_T nexus logs in afresh.
        let same_target = |s: &Session| match (&s.target, &req.target) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let old: Vec<u16> = inner
            .by_tsih
            .values()
            .filter(|s| {
                s.isid == req.isid
                    && s.initiator_name.eq_ignore_ascii_case(&req.initiator_name)
                    && same_target(s)
            })
            .map(|s| s.tsih)
            .collect();
        for tsih in old {
            if let Some(s) = inner.by_tsih.remove(&tsih) {
                tracing::info!(tsih, initiator = %s.initiator_name, "session reinstated: stopping the old connection");
                s.stop_connection();
            }
        }
        let tsih = Self::free_tsih(&mut inner).ok_or(SessionError::OutOfResources)?;
        let nexus = req
            .target
            .as_ref()
            .map(|t| ItNexus::iscsi(&req.initiator_name, req.isid, &t.name, req.tpgt));
        let (stop, _) = watch::channel(0);
        let s = Arc::new(Session {
            tsih,
            isid: req.isid,
            initiator_name: req.initiator_name,
            target: req.target,
            nexus,
            params: req.params,
            cid: Mutex::new(req.cid),
            stop,
            generation: Mutex::new(0),
        });
        inner.by_tsih.insert(tsih, s.clone());
        Ok(s)
    }

    /// Removes a session whose connection ended (at ErrorRecoveryLevel 0 a
    /// session does not outlive its last connection). Only the connection
    /// that still owns the session (same generation) removes it.
    pub fn detach(&self, session: &Arc<Session>, generation: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if session.generation() == generation {
            if let Some(s) = inner.by_tsih.get(&session.tsih) {
                if Arc::ptr_eq(s, session) {
                    inner.by_tsih.remove(&session.tsih);
                }
            }
        }
    }

    /// Every live session.
    pub fn all(&self) -> Vec<Arc<Session>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_tsih.values().cloned().collect()
    }

    fn free_tsih(inner: &mut TableInner) -> Option<u16> {
        for _ in 0..u16::MAX {
            inner.last_tsih = inner.last_tsih.wrapping_add(1);
            // TSIH 0 means "new session" on the wire and is never assigned.
            if inner.last_tsih != 0 && !inner.by_tsih.contains_key(&inner.last_tsih) {
                return Some(inner.last_tsih);
            }
        }
        None
    }
}
