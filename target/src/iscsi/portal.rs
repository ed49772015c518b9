//! Listening portals: accept TCP connections and hand them to the fabric.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::{connection, Fabric};

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
        let mut shutdown = fabric.shutdown.clone();
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        info!(%peer, tpgt = self.tpgt, "connection accepted");
                        connections.spawn(connection::serve(fabric.clone(), stream, self.tpgt));
                    }
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                },
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        break;
                    }
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(self.listener);
        while connections.join_next().await.is_some() {}
    }
}
