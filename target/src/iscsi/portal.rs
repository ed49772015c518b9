//! Listening portals: accept TCP connections and hand them to the fabric.
//!
//! A [`Portal`] is one bound listener of a portal group. [`PortalSet`] runs
//! the daemon's portals and can close one at run time, cutting every
//! connection that came in through it (as if that portal's network went
//! away) while the other portals and their sessions go on, and re-open it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{info, warn};

use super::{connection, Fabric};

/// Whether a portal on the IPv6 wildcard (`[::]`) also accepts IPv4
/// connections on this host. Portals are bound without IPV6_V6ONLY, so
/// Linux's `net.ipv6.bindv6only` decides: 0 (its default) makes `[::]:P`
/// take IPv4 too, and claim `0.0.0.0:P`. Read once.
pub fn ipv6_wildcard_takes_ipv4() -> bool {
    static DUAL_STACK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DUAL_STACK.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").map_or(true, |v| v.trim() == "0")
    })
}

/// A bound listener of one portal group.
#[derive(Debug)]
pub struct Portal {
    listener: TcpListener,
    tpgt: u16,
}

impl Portal {
    /// Binds `addr` for portal group `tpgt`.
    pub async fn bind(addr: SocketAddr, tpgt: u16) -> std::io::Result<Portal> {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot listen on {addr}: {e} (is another target using the port? pick another with --listen)"),
            )
        })?;
        Ok(Portal { listener, tpgt })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts connections until the fabric shuts down, then waits for the
    /// connections to finish (they ask their initiators to log out).
    pub async fn run(self, fabric: Arc<Fabric>) {
        let (_keep, close) = watch::channel(false);
        self.run_until_closed(fabric, close, Arc::default()).await;
    }

    /// [`Self::run`], also ending when `close` turns true: then the
    /// listener is dropped and every connection accepted here is cut at
    /// once; returns how many were. `live` counts the connections open.
    pub async fn run_until_closed(
        self,
        fabric: Arc<Fabric>,
        mut close: watch::Receiver<bool>,
        live: Arc<AtomicUsize>,
    ) -> usize {
        let mut shutdown = fabric.shutdown.clone();
        let mut connections = JoinSet::new();
        let (cut_tx, cut_rx) = watch::channel(false);
        let mut closed = false;
        let mut accept_warned: Option<std::time::Instant> = None;
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        info!(%peer, tpgt = self.tpgt, "connection accepted");
                        let live = live.clone();
                        live.fetch_add(1, Ordering::SeqCst);
                        let (f, tpgt, cut) = (fabric.clone(), self.tpgt, cut_rx.clone());
                        let serve = move |s| connection::serve_until_cut(f, s, tpgt, cut);
                        // Two tasks, each holding only what its road needs: a
                        // connection's state lives in the task that runs it.
                        match fabric.connection_threads.clone() {
                            Some(threads) => connections.spawn(async move {
                                threads.serve(stream, serve).await;
                                live.fetch_sub(1, Ordering::SeqCst);
                            }),
                            None => connections.spawn(async move {
                                serve(stream).await;
                                live.fetch_sub(1, Ordering::SeqCst);
                            }),
                        };
                    }
                    Err(e) => {
                        // Out of file descriptors, accept fails until a
                        // connection closes: say so once in a while, not ten
                        // times a second, and name the limit to raise.
                        let now = std::time::Instant::now();
                        if accept_warned.is_none_or(|t| now.duration_since(t).as_secs() >= 10) {
                            accept_warned = Some(now);
                            let open = live.load(Ordering::SeqCst);
                            if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                                warn!(
                                    error = %e,
                                    open,
                                    "accept failed: the open-file limit is reached; new connections wait \
                                     until one closes (raise it: ulimit -n, or LimitNOFILE= in the systemd unit)"
                                );
                            } else {
                                warn!(error = %e, open, "accept failed");
                            }
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                },
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        break;
                    }
                }
                _ = connection::turns_true(&mut close) => {
                    closed = true;
                    break;
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(self.listener);
        let cut = if closed { connections.len() } else { 0 };
        if closed {
            let _ = cut_tx.send(true);
        }
        while connections.join_next().await.is_some() {}
        cut
    }
}

/// Why a portal could not be closed or opened.
#[derive(Debug, thiserror::Error)]
pub enum PortalError {
    /// No portal of the set listens on that address.
    #[error("no portal listens on {asked}; portals are {}", list(.known))]
    Unknown {
        /// The address asked for.
        asked: SocketAddr,
        /// The portals there are.
        known: Vec<SocketAddr>,
    },
    /// It is closed already.
    #[error("portal {0} is closed already (open it with portal.open)")]
    AlreadyClosed(SocketAddr),
    /// It is open already.
    #[error("portal {0} is open already")]
    AlreadyOpen(SocketAddr),
    /// Binding it again failed.
    #[error("{0}")]
    Bind(std::io::Error),
}

fn list(addrs: &[SocketAddr]) -> String {
    if addrs.is_empty() {
        return "none".into();
    }
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One portal as [`PortalSet::list`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalInfo {
    /// The address it listens (or listened) on.
    pub addr: SocketAddr,
    /// Its portal group tag.
    pub tpgt: u16,
    /// Whether it accepts connections.
    pub open: bool,
    /// Connections open through it.
    pub connections: usize,
}

struct Entry {
    addr: SocketAddr,
    tpgt: u16,
    live: Arc<AtomicUsize>,
    running: Option<Running>,
}

struct Running {
    close: watch::Sender<bool>,
    task: JoinHandle<usize>,
}

/// The fabric's portals, by the address each one is bound to.
pub struct PortalSet {
    fabric: Arc<Fabric>,
    entries: tokio::sync::Mutex<Vec<Entry>>,
    /// The entries as [`PortalSet::list`] reads them, without the async lock.
    index: Mutex<Vec<Row>>,
}

struct Row {
    addr: SocketAddr,
    tpgt: u16,
    live: Arc<AtomicUsize>,
    open: bool,
}

impl std::fmt::Debug for PortalSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortalSet")
            .field("portals", &self.list())
            .finish()
    }
}

impl PortalSet {
    /// An empty set serving `fabric`.
    pub fn new(fabric: Arc<Fabric>) -> PortalSet {
        PortalSet {
            fabric,
            entries: tokio::sync::Mutex::new(Vec::new()),
            index: Mutex::new(Vec::new()),
        }
    }

    fn reindex(&self, entries: &[Entry]) {
        *self.index.lock().unwrap_or_else(|e| e.into_inner()) = entries
            .iter()
            .map(|e| Row {
                addr: e.addr,
                tpgt: e.tpgt,
                live: e.live.clone(),
                open: e.running.is_some(),
            })
            .collect();
    }

    /// Starts a bound portal; returns its address.
    pub async fn start(&self, portal: Portal) -> std::io::Result<SocketAddr> {
        let addr = portal.local_addr()?;
        let tpgt = portal.tpgt;
        let live = Arc::new(AtomicUsize::new(0));
        let running = self.spawn(portal, live.clone());
        let mut entries = self.entries.lock().await;
        entries.push(Entry {
            addr,
            tpgt,
            live,
            running: Some(running),
        });
        self.reindex(&entries);
        Ok(addr)
    }

    fn spawn(&self, portal: Portal, live: Arc<AtomicUsize>) -> Running {
        let (close, rx) = watch::channel(false);
        let task = tokio::spawn(portal.run_until_closed(self.fabric.clone(), rx, live));
        Running { close, task }
    }

    fn unknown(entries: &[Entry], asked: SocketAddr) -> PortalError {
        PortalError::Unknown {
            asked,
            known: entries.iter().map(|e| e.addr).collect(),
        }
    }

    /// Closes the portal listening on `addr`: no new connection is
    /// accepted there and every connection that came in through it is cut
    /// (their sessions end, their tasks are aborted). Returns once they
    /// are gone, with how many were cut.
    pub async fn close(&self, addr: SocketAddr) -> Result<usize, PortalError> {
        let mut entries = self.entries.lock().await;
        let Some(e) = entries.iter_mut().find(|e| e.addr == addr) else {
            return Err(Self::unknown(&entries, addr));
        };
        let Some(running) = e.running.take() else {
            return Err(PortalError::AlreadyClosed(addr));
        };
        let _ = running.close.send(true);
        let cut = running.task.await.unwrap_or(0);
        warn!(portal = %addr, tpgt = e.tpgt, connections = cut, "portal closed: its connections were cut");
        self.reindex(&entries);
        Ok(cut)
    }

    /// Takes the portal on `addr` out of the set for good (it left the
    /// configuration): closed as by [`PortalSet::close`] if open, then
    /// forgotten. Returns how many connections were cut.
    pub async fn remove(&self, addr: SocketAddr) -> Result<usize, PortalError> {
        let mut entries = self.entries.lock().await;
        let Some(i) = entries.iter().position(|e| e.addr == addr) else {
            return Err(Self::unknown(&entries, addr));
        };
        let e = entries.remove(i);
        let cut = match e.running {
            Some(running) => {
                let _ = running.close.send(true);
                running.task.await.unwrap_or(0)
            }
            None => 0,
        };
        info!(portal = %addr, tpgt = e.tpgt, connections = cut, "portal removed");
        self.reindex(&entries);
        Ok(cut)
    }

    /// Opens the closed portal `addr` again (same address, same portal
    /// group).
    pub async fn reopen(&self, addr: SocketAddr) -> Result<(), PortalError> {
        let mut entries = self.entries.lock().await;
        let Some(i) = entries.iter().position(|e| e.addr == addr) else {
            return Err(Self::unknown(&entries, addr));
        };
        if entries[i].running.is_some() {
            return Err(PortalError::AlreadyOpen(addr));
        }
        let portal = Portal::bind(addr, entries[i].tpgt)
            .await
            .map_err(PortalError::Bind)?;
        let running = self.spawn(portal, entries[i].live.clone());
        entries[i].running = Some(running);
        info!(portal = %addr, tpgt = entries[i].tpgt, "portal open again");
        self.reindex(&entries);
        Ok(())
    }

    /// Every portal, in the order they were started.
    pub fn list(&self) -> Vec<PortalInfo> {
        self.index
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|r| PortalInfo {
                addr: r.addr,
                tpgt: r.tpgt,
                open: r.open,
                connections: r.live.load(Ordering::SeqCst),
            })
            .collect()
    }

    /// Waits until every open portal ended (the fabric shut down and their
    /// connections finished).
    pub async fn join(&self) {
        let running: Vec<Running> = {
            let mut entries = self.entries.lock().await;
            let r = entries
                .iter_mut()
                .filter_map(|e| e.running.take())
                .collect();
            self.reindex(&entries);
            r
        };
        for r in running {
            // `r.close` lives until its portal ended: it is not closed.
            let _ = r.task.await;
        }
    }
}
