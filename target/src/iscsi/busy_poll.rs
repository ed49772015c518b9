//! Busy polling of a connection's socket (`[fabric] busy_poll_us`).
//!
//! A connection that has handled what the initiator sent normally sleeps in
//! `epoll_wait` until the next PDU. Waking it again costs the initiator's
//! `send` an inter-processor interrupt to the target's CPU, and on a virtual
//! machine the hypervisor's wake-up of an idle virtual CPU as well: on the
//! 2-vCPU VM of interop/results/bench-vs-tgtd.md that is most of a 4 KiB
//! QD1 round trip. With a budget set, the connection first lets its writer
//! send the responses, then looks at the socket for the next PDU (a
//! non-blocking `MSG_PEEK`) again and again for at most that long, yielding
//! to the runtime's other tasks between looks, and sleeps only if nothing
//! came. The CPU stays busy in the meantime, which is the price: up to the
//! budget of CPU time after every socket read, taken from whatever else
//! shares the machine (clients on the same cores included). Off by default.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::RecvFlags;
use tokio::net::TcpStream;

/// The most a connection may spin per wait; a longer budget would burn a
/// CPU for little (a PDU that takes longer than this to come is not held up
/// by one wake-up).
pub const BUSY_POLL_MAX: Duration = Duration::from_millis(1);

/// One connection's busy poll: its socket (a duplicate of the descriptor,
/// so that the writer task may own the stream) and its budget.
#[derive(Debug)]
pub struct BusyPoll {
    socket: OwnedFd,
    budget: Duration,
}

impl BusyPoll {
    /// Busy polling of `stream` for up to `budget` per wait.
    pub fn new(stream: &TcpStream, budget: Duration) -> io::Result<BusyPoll> {
        Ok(BusyPoll {
            socket: stream.as_fd().try_clone_to_owned()?,
            budget: budget.min(BUSY_POLL_MAX),
        })
    }

    /// Yields once (so that the responses already queued are sent), then
    /// looks for something to read until the budget runs out. True when
    /// the socket has bytes, an end of stream or an error to report (the
    /// reader finds out which); false when the budget ran out first.
    pub async fn until_readable(&self) -> bool {
        let deadline = Instant::now() + self.budget;
        loop {
            tokio::task::yield_now().await;
            if self.readable_now() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// True when a read would not block.
    fn readable_now(&self) -> bool {
        let mut probe = [0u8; 1];
        match rustix::net::recv(
            &self.socket,
            &mut probe[..],
            RecvFlags::PEEK | RecvFlags::DONTWAIT,
        ) {
            Err(Errno::AGAIN) | Err(Errno::INTR) => false,
            // A byte, the end of the stream (0) or an error: the reader
            // must look.
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn an_idle_socket_spends_the_budget_and_reports_nothing() {
        let (_client, server) = pair().await;
        let poll = BusyPoll::new(&server, Duration::from_micros(300)).unwrap();
        let start = Instant::now();
        assert!(!poll.until_readable().await);
        assert!(start.elapsed() >= Duration::from_micros(300));
    }

    #[tokio::test]
    async fn bytes_already_there_are_reported_and_left_for_the_reader() {
        let (mut client, server) = pair().await;
        client.write_all(b"PDU").await.unwrap();
        let poll = BusyPoll::new(&server, BUSY_POLL_MAX).unwrap();
        // Loopback delivers within the send; the peek must see the bytes
        // well inside the budget, and must not take them.
        let mut seen = false;
        for _ in 0..100 {
            if poll.until_readable().await {
                seen = true;
                break;
            }
        }
        assert!(seen, "three bytes sent, never readable");
        let mut buf = [0u8; 8];
        server.readable().await.unwrap();
        assert_eq!(server.try_read(&mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], b"PDU");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_sent_while_polling_end_the_poll() {
        let (mut client, server) = pair().await;
        let poll = BusyPoll::new(&server, BUSY_POLL_MAX).unwrap();
        let sender = tokio::spawn(async move {
            client.write_all(b"x").await.unwrap();
            client
        });
        let mut seen = false;
        for _ in 0..10_000 {
            if poll.until_readable().await {
                seen = true;
                break;
            }
        }
        assert!(seen, "a byte was sent, the poll never saw it");
        drop(sender.await.unwrap());
    }

    #[tokio::test]
    async fn a_closed_peer_is_reported_so_the_reader_sees_the_end() {
        let (client, server) = pair().await;
        drop(client);
        let poll = BusyPoll::new(&server, BUSY_POLL_MAX).unwrap();
        let mut seen = false;
        for _ in 0..100 {
            if poll.until_readable().await {
                seen = true;
                break;
            }
        }
        assert!(seen, "the peer closed, the poll kept waiting");
    }

    #[tokio::test]
    async fn the_budget_is_capped() {
        let (_client, server) = pair().await;
        let poll = BusyPoll::new(&server, Duration::from_secs(5)).unwrap();
        assert_eq!(poll.budget, BUSY_POLL_MAX);
    }
}
