//! The threads iSCSI connections run on (`[fabric] connection_threads`).
//!
//! Each thread runs a single-threaded runtime of its own, and a connection
//! (its reader, its writer and the commands it starts) lives on one of them
//! from login to close: it reads a PDU, runs the command and sends the
//! response on one thread, and that thread sleeps in `epoll_wait` only when
//! none of its connections has anything to do. New connections go to the
//! thread with the fewest. Commands that block (the SCSI core on files and
//! devices) still go to a blocking pool, the runtime's own.
//!
//! Why not the daemon's work-stealing runtime: there, while one worker ran
//! a connection, another sat in `epoll_wait` holding the I/O driver, and
//! every segment on the connection's socket (the command, the ACK of a
//! response) woke that second worker only to hand the task back. `strace
//! -f` of a 4 KiB QD1 WRITE pinned to one CPU showed, per command, 2.9
//! `epoll_wait` and 1.8 eventfd writes beside the one `recvfrom`,
//! `pwrite64` and `sendmsg` the command needs.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::warn;

/// The connection threads of a fabric, started when the first connection
/// comes.
#[derive(Debug)]
pub struct ConnectionThreads {
    count: usize,
    threads: OnceLock<Vec<ConnectionThread>>,
}

/// One thread and its runtime.
#[derive(Debug)]
struct ConnectionThread {
    handle: Handle,
    /// Connections running on it now.
    connections: Arc<AtomicUsize>,
    /// Dropped with the fabric: the thread's runtime then ends.
    _stop: oneshot::Sender<()>,
}

impl ConnectionThreads {
    /// `count` threads (at least one).
    pub fn new(count: usize) -> ConnectionThreads {
        ConnectionThreads {
            count: count.max(1),
            threads: OnceLock::new(),
        }
    }

    /// One thread per CPU this process may run on.
    pub fn one_per_cpu() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    /// Connections running on each thread now (all zero before the first
    /// connection starts the threads).
    pub fn connections(&self) -> Vec<usize> {
        self.threads.get().map_or_else(
            || vec![0; self.count],
            |threads| {
                threads
                    .iter()
                    .map(|t| t.connections.load(Ordering::Relaxed))
                    .collect()
            },
        )
    }

    /// Runs `serve` on `stream`, on the connection thread with the fewest
    /// connections; returns when it ends. Dropping the returned future
    /// (the portal's set of connections is dropped) aborts the connection.
    /// If no thread could be started the connection runs right here.
    pub async fn serve<F, Fut>(&self, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(thread) = self.least_busy() else {
            // Boxed: the connection's state machine stays out of this
            // future's, which waits on the connection thread otherwise.
            return Box::pin(serve(stream)).await;
        };
        // The socket leaves this runtime's I/O driver for the thread's.
        let std_stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot move the connection to a connection thread: dropping it");
                return;
            }
        };
        let held = Held::new(thread.connections.clone());
        let task = thread.handle.spawn(async move {
            let _held = held;
            match TcpStream::from_std(std_stream) {
                Ok(stream) => serve(stream).await,
                Err(e) => {
                    warn!(error = %e, "connection thread cannot take the connection: dropping it")
                }
            }
        });
        let mut task = AbortOnDrop(task);
        if let Err(e) = (&mut task.0).await {
            if e.is_panic() {
                warn!("a connection panicked on its connection thread");
            }
        }
    }

    /// The thread with the fewest connections, starting the threads first
    /// if none run yet.
    fn least_busy(&self) -> Option<&ConnectionThread> {
        let threads = match self.threads.get() {
            Some(t) => t,
            None => {
                let started = start(self.count);
                if started.is_empty() {
                    return None;
                }
                // Two first connections racing: the loser's threads stop.
                let _ = self.threads.set(started);
                self.threads.get()?
            }
        };
        threads
            .iter()
            .min_by_key(|t| t.connections.load(Ordering::Relaxed))
    }
}

/// Starts `count` threads, each running a single-threaded runtime until
/// its stop sender is dropped; fewer if the system refuses threads.
fn start(count: usize) -> Vec<ConnectionThread> {
    let mut threads = Vec::with_capacity(count);
    for i in 0..count {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name(format!("blockwire-conn{i}-pool"))
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "cannot start a connection thread's runtime");
                break;
            }
        };
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name(format!("blockwire-conn{i}"))
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start a connection thread");
            break;
        }
        threads.push(ConnectionThread {
            handle,
            connections: Arc::default(),
            _stop: stop,
        });
    }
    threads
}

/// Counts one connection on its thread while alive.
struct Held(Arc<AtomicUsize>);

impl Held {
    fn new(count: Arc<AtomicUsize>) -> Held {
        count.fetch_add(1, Ordering::Relaxed);
        Held(count)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A task on another runtime that ends when its handle is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// Echoes one byte, and says which thread served it.
    async fn echo_once(mut s: TcpStream, thread: oneshot::Sender<String>) {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        let _ = thread.send(std::thread::current().name().unwrap_or("").to_string());
        s.write_all(&b).await.unwrap();
    }

    /// A client connected to an echo served on `threads`, the portal-side
    /// task serving it, and where the echo says which thread it runs on.
    async fn echo_on(
        threads: &Arc<ConnectionThreads>,
    ) -> (TcpStream, JoinHandle<()>, oneshot::Receiver<String>) {
        let (client, accepted) = pair().await;
        let (tx, rx) = oneshot::channel();
        let t = threads.clone();
        let served = tokio::spawn(async move { t.serve(accepted, |s| echo_once(s, tx)).await });
        (client, served, rx)
    }

    /// Waits (up to 5 s) until the threads count `expected` connections.
    async fn until_counted(threads: &ConnectionThreads, expected: &[usize]) {
        for _ in 0..500 {
            if threads.connections() == expected {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!(
            "counts stayed {:?}, not {expected:?}",
            threads.connections()
        );
    }

    #[tokio::test]
    async fn a_connection_is_served_on_a_connection_thread_and_counted_while_it_runs() {
        let threads = Arc::new(ConnectionThreads::new(2));
        let (mut client, served, rx) = echo_on(&threads).await;
        client.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        client.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"x");
        let name = rx.await.unwrap();
        assert!(name.starts_with("blockwire-conn"), "served on {name:?}");
        served.await.unwrap();
        assert_eq!(
            threads.connections(),
            vec![0, 0],
            "counts drop when it ends"
        );
    }

    /// Says which thread serves it, then holds the connection until the
    /// client closes it.
    async fn hold_until_closed(mut s: TcpStream, thread: oneshot::Sender<String>) {
        let _ = thread.send(std::thread::current().name().unwrap_or("").to_string());
        let mut b = [0u8; 16];
        while s.read(&mut b).await.is_ok_and(|n| n > 0) {}
    }

    #[tokio::test]
    async fn new_connections_go_to_the_thread_with_the_fewest() {
        let threads = Arc::new(ConnectionThreads::new(2));
        let mut names = Vec::new();
        let mut clients = Vec::new();
        let mut running = Vec::new();
        for _ in 0..4 {
            let (client, accepted) = pair().await;
            let (tx, rx) = oneshot::channel();
            let t = threads.clone();
            running.push(tokio::spawn(async move {
                t.serve(accepted, |s| hold_until_closed(s, tx)).await
            }));
            names.push(rx.await.unwrap());
            clients.push(client);
        }
        assert_eq!(threads.connections(), vec![2, 2], "{names:?}");
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            [
                "blockwire-conn0",
                "blockwire-conn0",
                "blockwire-conn1",
                "blockwire-conn1"
            ]
        );
        drop(clients);
        for r in running {
            r.await.unwrap();
        }
        assert_eq!(threads.connections(), vec![0, 0]);
    }

    #[tokio::test]
    async fn dropping_the_serving_future_ends_the_connection() {
        let threads = Arc::new(ConnectionThreads::new(1));
        let (mut client, served, rx) = echo_on(&threads).await;
        // The connection waits for a byte that never comes; abort its
        // portal-side future.
        until_counted(&threads, &[1]).await;
        served.abort();
        let _ = served.await;
        // The connection's task was aborted: the socket closes and the
        // thread's count drops.
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), client.read(&mut b))
            .await
            .expect("the connection ends")
            .unwrap_or(0);
        assert_eq!(n, 0, "end of stream");
        drop(rx);
        until_counted(&threads, &[0]).await;
    }
}
