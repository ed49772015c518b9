//! The iSNS client's I/O: one TCP connection to the server, the
//! registrar's timers, configuration changes and the daemon's stop. All
//! decisions are the [`Registrar`]'s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockwire_pdu::isns::MessageReader;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::registrar::{Registrar, State, Status};
use super::registration::Registration;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The running client: where to send configuration changes, and its status.
#[derive(Debug)]
pub struct Client {
    server: String,
    entity: String,
    period_secs: u32,
    wanted: watch::Sender<Registration>,
    /// Ends this client alone (a live change of `[isns]`): it deregisters.
    retire: watch::Sender<bool>,
    status: Arc<Mutex<Status>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Client {
    /// Starts registering `wanted` with `server` (HOST:PORT); `stop` turning
    /// true deregisters and ends the client.
    pub fn start(server: String, wanted: Registration, stop: watch::Receiver<bool>) -> Client {
        let entity = wanted.entity.clone();
        let period_secs = wanted.period_secs;
        let registrar = Registrar::new(wanted.clone(), Instant::now().into_std());
        let status = Arc::new(Mutex::new(registrar.status().clone()));
        let (tx, rx) = watch::channel(wanted);
        let (retire, retired) = watch::channel(false);
        let stops = Stops {
            daemon: stop,
            retired,
        };
        let task = tokio::spawn(run(server.clone(), registrar, rx, stops, status.clone()));
        Client {
            server,
            entity,
            period_secs,
            wanted: tx,
            retire,
            status,
            task: Mutex::new(Some(task)),
        }
    }

    /// Registers what `catalog` serves through its portals (bound as
    /// `bound` says) from now on: the server hears of a change at once.
    pub fn serve(
        &self,
        catalog: &blockwire_target::iscsi::catalog::Catalog,
        bound: &std::collections::HashMap<(std::net::SocketAddr, u16), std::net::SocketAddr>,
    ) {
        self.update(Registration::of(
            &self.entity,
            self.period_secs,
            catalog,
            bound,
        ));
    }

    /// Registers `wanted` from now on (the server hears of it at once).
    pub fn update(&self, wanted: Registration) {
        self.wanted.send_if_modified(|w| {
            let changed = *w != wanted;
            *w = wanted;
            changed
        });
    }

    /// The server's address as configured.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The Entity Identifier registered.
    pub fn entity(&self) -> &str {
        &self.entity
    }

    /// The registration's state now.
    pub fn status(&self) -> Status {
        self.status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Deregisters and ends this client while the daemon runs on (its
    /// `[isns]` changed); [`Client::join`] waits for it.
    pub fn retire(&self) {
        let _ = self.retire.send(true);
    }

    /// Waits for the client to finish (after the daemon's stop or
    /// [`Client::retire`]: at most the deregistration's answer timeout).
    pub async fn join(&self) {
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = task {
            let _ = t.await;
        }
    }
}

/// What ends a client: the daemon's stop (true, or its sender gone) or
/// its own retirement.
struct Stops {
    daemon: watch::Receiver<bool>,
    retired: watch::Receiver<bool>,
}

async fn run(
    server: String,
    mut reg: Registrar,
    mut wanted: watch::Receiver<Registration>,
    stops: Stops,
    status: Arc<Mutex<Status>>,
) {
    let Stops {
        daemon: mut stop,
        mut retired,
    } = stops;
    let mut retired_open = true;
    let mut conn: Option<TcpStream> = None;
    let mut reader = MessageReader::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_state = reg.status().state.clone();
    let mut last_error = None;
    // A sender dropped is heard once: its branch is then left out, so that
    // a closed channel does not wake the loop again and again.
    let mut wanted_open = true;
    let mut stop_open = true;
    if *stop.borrow() {
        reg.stop(Instant::now().into_std());
    }
    loop {
        let now = Instant::now().into_std();
        if conn.is_none() && reg.wants_connection(now) {
            reg.connecting();
            let attempt = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&server)).await;
            let now = Instant::now().into_std();
            match attempt {
                Ok(Ok(s)) => match s.local_addr() {
                    Ok(local) => {
                        let _ = s.set_nodelay(true);
                        conn = Some(s);
                        reader = MessageReader::new();
                        reg.connected(local.ip(), now);
                    }
                    Err(e) => reg.failed(format!("connected to {server}, but: {e}"), now),
                },
                Ok(Err(e)) => reg.failed(
                    format!("cannot connect to the iSNS server {server}: {e}"),
                    now,
                ),
                Err(_) => reg.failed(
                    format!(
                        "the iSNS server {server} did not accept a connection in {} s",
                        CONNECT_TIMEOUT.as_secs()
                    ),
                    now,
                ),
            }
        }
        while let Some(m) = reg.poll_transmit() {
            let Some(s) = conn.as_mut() else { break };
            let sent = match m.encode() {
                Ok(bytes) => s.write_all(&bytes).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = sent {
                conn = None;
                reg.failed(
                    format!("sending to the iSNS server {server}: {e}"),
                    Instant::now().into_std(),
                );
            }
        }
        if reg.take_close() {
            conn = None;
        }
        publish(&reg, &status, &server, &mut last_state, &mut last_error);
        if reg.is_done() {
            break;
        }
        let deadline = reg.poll_timeout().map(Instant::from_std);
        tokio::select! {
            read = async {
                match conn.as_mut() {
                    Some(s) => s.read(&mut buf).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = Instant::now().into_std();
                match read {
                    Ok(0) => {
                        conn = None;
                        reg.closed(now);
                    }
                    Ok(n) => {
                        reader.feed(&buf[..n]);
                        loop {
                            match reader.next_message() {
                                Ok(Some(m)) => reg.received(m, now),
                                Ok(None) => break,
                                Err(e) => {
                                    conn = None;
                                    reg.failed(format!("the iSNS server {server} sent {e}"), now);
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        conn = None;
                        reg.failed(format!("reading from the iSNS server {server}: {e}"), now);
                    }
                }
            }
            _ = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => reg.handle_timeout(Instant::now().into_std()),
            changed = wanted.changed(), if wanted_open => {
                if changed.is_ok() {
                    let w = wanted.borrow_and_update().clone();
                    reg.update(w, Instant::now().into_std());
                } else {
                    wanted_open = false;
                }
            }
            changed = stop.changed(), if stop_open => {
                // The daemon's stop, or its sender gone: stop either way.
                if changed.is_err() {
                    stop_open = false;
                }
                if changed.is_err() || *stop.borrow() {
                    reg.stop(Instant::now().into_std());
                }
            }
            changed = retired.changed(), if retired_open => {
                // Retired, or the client dropped: stop either way.
                retired_open = false;
                if changed.is_err() || *retired.borrow() {
                    reg.stop(Instant::now().into_std());
                }
            }
        }
    }
}

/// Shares the registrar's status and logs what changed.
fn publish(
    reg: &Registrar,
    status: &Mutex<Status>,
    server: &str,
    last_state: &mut State,
    last_error: &mut Option<String>,
) {
    let s = reg.status();
    if let Ok(mut shared) = status.lock() {
        *shared = s.clone();
    }
    if s.last_error != *last_error {
        if let Some(e) = &s.last_error {
            warn!(server, "iSNS: {e}");
        }
        *last_error = s.last_error.clone();
    }
    if s.state != *last_state {
        match s.state {
            State::Registered => info!(
                server,
                targets = s.targets,
                portals = s.portals,
                period_secs = s.period_secs,
                "iSNS: registered"
            ),
            State::Stopped => info!(server, "iSNS: registration ended"),
            _ => {}
        }
        *last_state = s.state.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isns::registration::Node;

    fn wanted() -> Registration {
        Registration {
            entity: "host-a".into(),
            period_secs: 900,
            portals: vec![("127.0.0.1:3260".parse().unwrap(), 1)],
            nodes: vec![Node {
                name: "iqn.2026-12.io.blockwire:t".into(),
                alias: None,
                groups: vec![1],
            }],
        }
    }

    /// A server that refuses connections: the client says so, backs off,
    /// and ends at the daemon's stop (or when the stop's sender is gone)
    /// without anything to deregister.
    #[tokio::test]
    async fn an_unreachable_server_is_said_and_the_stop_ends_the_client() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (tx, rx) = watch::channel(false);
        let client = Client::start(format!("127.0.0.1:{port}"), wanted(), rx);
        let deadline = Instant::now() + Duration::from_secs(5);
        while client.status().failures == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let s = client.status();
        assert_eq!(s.state, State::Waiting);
        let e = s.last_error.unwrap();
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
        drop(tx);
        tokio::time::timeout(Duration::from_secs(2), client.join())
            .await
            .expect("the client ends when its stop's sender is gone");
        assert_eq!(client.status().state, State::Stopped);
    }

    /// A client retired while the daemon runs on (its `[isns]` changed)
    /// ends by itself; the daemon's stop stays false.
    #[tokio::test]
    async fn a_retired_client_ends_while_the_daemon_runs() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (_tx, rx) = watch::channel(false);
        let client = Client::start(format!("127.0.0.1:{port}"), wanted(), rx);
        client.retire();
        tokio::time::timeout(Duration::from_secs(2), client.join())
            .await
            .expect("a retired client ends");
        assert_eq!(client.status().state, State::Stopped);
    }
}
