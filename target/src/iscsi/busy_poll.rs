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
//! budget of CPU time per wait. Off by default.
//!
//! Two rules keep the spin from taking CPU that others need:
//! - Between looks the poll gives the CPU to any other runnable thread
//!   (`sched_yield`); when one took it, the connection stops polling for a
//!   while, so a client on the same CPU is not starved.
//! - Only connections whose socket reads bring about one PDU poll (QD1: a
//!   round trip per command). With commands queued, a read brings several
//!   and the connection has work without a wake-up per command; a spin
//!   between batches then kept the target's CPU busy, the scheduler packed
//!   the client onto the other CPU, and 4 KiB QD32 lost about a third of
//!   its IOPS on the 2-vCPU VM (interop/results/bench-vs-tgtd.md).

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

/// A `sched_yield` that returns later than this ran something else first.
/// With nothing else runnable it is one system call, about a microsecond.
const CONTENDED: Duration = Duration::from_micros(10);

/// A connection polls while its socket reads bring fewer PDUs than this on
/// average (see [`BusyPoll::note_read`]).
const POLL_BELOW_PDUS_PER_READ: u32 = 2;

/// How long a connection leaves off polling once its CPU turned out to
/// have other work.
const REST: Duration = Duration::from_millis(10);

/// One connection's busy poll: its socket (a duplicate of the descriptor,
/// so that the writer task may own the stream) and its budget.
#[derive(Debug)]
pub struct BusyPoll {
    socket: OwnedFd,
    budget: Duration,
    /// Set when another task wanted this CPU during a poll: no polling
    /// until then.
    rest_until: Option<Instant>,
    /// PDUs per socket read, a moving average in sixteenths.
    pdus_per_read_x16: u32,
}

impl BusyPoll {
    /// Busy polling of `stream` for up to `budget` per wait.
    pub fn new(stream: &TcpStream, budget: Duration) -> io::Result<BusyPoll> {
        Ok(BusyPoll {
            socket: stream.as_fd().try_clone_to_owned()?,
            budget: budget.min(BUSY_POLL_MAX),
            rest_until: None,
            pdus_per_read_x16: 16,
        })
    }

    /// Yields to the runtime (so that the responses already queued are
    /// sent), then looks for something to read until the budget runs out,
    /// giving the CPU to any other runnable thread between looks
    /// (`sched_yield`). If one took it, the CPU is not idle without the
    /// poll: the poll ends and the connection does not poll for [`REST`].
    /// Connections whose reads bring several PDUs do not poll at all.
    ///
    /// True when the socket has bytes, an end of stream or an error to
    /// report (the reader finds out which); false when the budget ran out
    /// first, or the connection did not poll.
    pub async fn until_readable(&mut self) -> bool {
        if self.pdus_per_read_x16 >= POLL_BELOW_PDUS_PER_READ * 16 {
            return false;
        }
        if let Some(until) = self.rest_until {
            if Instant::now() < until {
                return false;
            }
            self.rest_until = None;
        }
        let deadline = Instant::now() + self.budget;
        loop {
            tokio::task::yield_now().await;
            if self.readable_now() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            // Let whatever else is runnable on this CPU (the initiator
            // itself, when it shares the CPU) run before the next look.
            let before = Instant::now();
            std::thread::yield_now();
            if before.elapsed() >= CONTENDED {
                // Something else ran: this CPU has work without the poll.
                // Sleep in epoll instead, and leave the CPU to the others
                // for a while.
                self.rest_until = Some(Instant::now() + REST);
                return false;
            }
        }
    }

    /// Counts the PDUs the last socket read brought. Reads that bring
    /// several mean the initiator keeps commands queued: the connection has
    /// work without waking for each one, and a spin between batches would
    /// only take CPU from the initiator. So polling is for connections
    /// whose reads bring about one PDU (QD1, a round trip per command).
    pub fn note_read(&mut self, pdus: u32) {
        let pdus = pdus.min(64) * 16;
        self.pdus_per_read_x16 = (self.pdus_per_read_x16 * 7 + pdus) / 8;
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

    /// Polls until the socket is readable, for at most 10 s (a poll that
    /// finds its CPU busy rests 10 ms and reports nothing meanwhile).
    async fn readable_within(poll: &mut BusyPoll) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if poll.until_readable().await {
                return true;
            }
        }
        false
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn an_idle_socket_spends_the_budget_and_reports_nothing() {
        let (_client, server) = pair().await;
        let mut poll = BusyPoll::new(&server, Duration::from_micros(300)).unwrap();
        let start = Instant::now();
        assert!(!poll.until_readable().await);
        // Unless another thread took this CPU (the poll then stops early
        // and rests), the whole budget went by.
        if poll.rest_until.is_none() {
            assert!(start.elapsed() >= Duration::from_micros(300));
        }
    }

    #[tokio::test]
    async fn bytes_already_there_are_reported_and_left_for_the_reader() {
        let (mut client, server) = pair().await;
        client.write_all(b"PDU").await.unwrap();
        let mut poll = BusyPoll::new(&server, BUSY_POLL_MAX).unwrap();
        // Loopback delivers within the send; the peek must see the bytes
        // well inside the budget, and must not take them.
        let seen = readable_within(&mut poll).await;
        assert!(seen, "three bytes sent, never readable");
        let mut buf = [0u8; 8];
        server.readable().await.unwrap();
        assert_eq!(server.try_read(&mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], b"PDU");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_sent_while_polling_end_the_poll() {
        let (mut client, server) = pair().await;
        let mut poll = BusyPoll::new(&server, BUSY_POLL_MAX).unwrap();
        let sender = tokio::spawn(async move {
            client.write_all(b"x").await.unwrap();
            client
        });
        let seen = readable_within(&mut poll).await;
        assert!(seen, "a byte was sent, the poll never saw it");
        drop(sender.await.unwrap());
    }

    #[tokio::test]
    async fn a_closed_peer_is_reported_so_the_reader_sees_the_end() {
        let (client, server) = pair().await;
        drop(client);
        let mut poll = BusyPoll::new(&server, BUSY_POLL_MAX).unwrap();
        let seen = readable_within(&mut poll).await;
        assert!(seen, "the peer closed, the poll kept waiting");
    }

    #[tokio::test]
    async fn a_resting_connection_does_not_poll() {
        let (mut client, server) = pair().await;
        client.write_all(b"PDU").await.unwrap();
        let mut poll = BusyPoll::new(&server, BUSY_POLL_MAX).unwrap();
        poll.rest_until = Some(Instant::now() + Duration::from_secs(60));
        for _ in 0..100 {
            assert!(!poll.until_readable().await, "polled while resting");
        }
        poll.rest_until = Some(Instant::now());
        let seen = readable_within(&mut poll).await;
        assert!(seen, "the rest is over, the bytes are there");
        assert_eq!(poll.rest_until, None);
    }

    #[tokio::test]
    async fn reads_that_bring_several_pdus_turn_polling_off() {
        let (mut client, server) = pair().await;
        client.write_all(b"PDU").await.unwrap();
        let mut poll = BusyPoll::new(&server, BUSY_POLL_MAX).unwrap();
        for _ in 0..16 {
            poll.note_read(7);
        }
        for _ in 0..100 {
            assert!(!poll.until_readable().await, "polled at 7 PDUs per read");
        }
        for _ in 0..32 {
            poll.note_read(1);
        }
        assert!(readable_within(&mut poll).await, "one PDU per read again");
    }

    #[tokio::test]
    async fn the_budget_is_capped() {
        let (_client, server) = pair().await;
        let poll = BusyPoll::new(&server, Duration::from_secs(5)).unwrap();
        assert_eq!(poll.budget, BUSY_POLL_MAX);
    }
}
