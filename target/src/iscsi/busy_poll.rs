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
//! budget of CPU time per wait. Off unless a budget is set (the daemon's
//! `[fabric] busy_poll_us` defaults to 50 us).
//!
//! These rules keep the spin from taking CPU that others need:
//! - Between looks the poll gives the CPU to any other runnable thread
//!   (`sched_yield`); when one took it, the connection stops polling for a
//!   while, so a client on the same CPU is not starved.
//! - Only connections whose socket reads bring about one PDU poll (QD1: a
//!   round trip per command). With commands queued, a read brings several
//!   and the connection has work without a wake-up per command; a spin
//!   between batches then kept the target's CPU busy, the scheduler packed
//!   the client onto the other CPU, and 4 KiB QD32 lost about a third of
//!   its IOPS on the 2-vCPU VM (interop/results/bench-vs-tgtd.md). Such a
//!   connection may nap instead (`super::batch_nap`).
//! - Only while the initiator has seen every response: the ExpStatSN of the
//!   last PDU it sent acknowledges all StatSNs but the one the writer gave
//!   last (RFC 7143 §4.2.2.2). An initiator that is behind has responses
//!   still to handle, so it is busy, not waiting on the target, and its
//!   next command comes when it gets to it: a spin then only takes CPU from
//!   it. This rule does not cover every busy initiator: QEMU's iscsi driver
//!   behind qemu-nbd sends one command per socket read even at QD32 and
//!   acknowledges each response before the next command, and on the 2-vCPU
//!   VM its 4 KiB WRITEs at QD32 ran at 1.10-1.30x tgtd's IOPS with a 50 us
//!   spin against 1.38-1.40x without, until the run-queue rule below.
//! - Only while no other connection of the target is awake (handling PDUs
//!   rather than waiting in `epoll_wait`): with others at work the CPU is
//!   not idle without the spin, and the spin holds up their PDUs. With 100
//!   sessions at QD1 on the same VM the spin cost 12-22 % of the target's
//!   IOPS (`bench/many-sessions.sh`).
//! - Only while every runnable thread of the machine has a CPU: the fourth
//!   field of `/proc/loadavg` counts the threads running or waiting for a
//!   CPU, the polling one included, and the poll stops when that is more
//!   than the online CPUs (read when a look finds nothing to read, at most
//!   every [`RUN_QUEUE_EVERY`]). The `sched_yield` rule only sees this CPU's
//!   queue; a thread woken while the spin keeps this CPU busy is put on
//!   another CPU's queue, behind whatever runs there, and waits. With this
//!   rule QEMU's 4 KiB QD32 WRITEs keep their pace with a 50 us spin. The
//!   count is the whole machine's: a container held to a CPU quota on a
//!   larger host is not seen to be full (the `sched_yield` rule still
//!   applies there).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
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

/// How often a poll reads the machine's run queue: generating
/// `/proc/loadavg` costs about 2 us on the 2-vCPU AMD VM of
/// interop/results/bench-vs-tgtd.md (a look at the socket about 0.5 us), and
/// reading it on every look took 5 % of the target's CPU under 4 KiB WRITEs
/// at QD32 through qemu-nbd. A thread that waits for a CPU waits at most
/// this much longer for the spin to give one up.
const RUN_QUEUE_EVERY: Duration = Duration::from_micros(10);

/// How long a connection leaves off polling once its CPU turned out to
/// have other work.
const REST: Duration = Duration::from_millis(10);

/// The StatSN the connection's writer gives its next response, published
/// as responses leave, so that the reader can tell whether the initiator
/// has seen them all.
#[derive(Debug, Clone)]
pub struct NextStatSn(Arc<AtomicU32>);

impl NextStatSn {
    /// Starts at `first`, the StatSN of the first response.
    pub fn new(first: u32) -> NextStatSn {
        NextStatSn(Arc::new(AtomicU32::new(first)))
    }

    /// A response left; `next` is the StatSN of the one after it.
    pub fn set(&self, next: u32) {
        self.0.store(next, Ordering::Relaxed);
    }

    /// The StatSN of the next response.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a connection's busy poll looks at besides its own socket: the
/// target's other connections, and the machine's other threads.
#[derive(Debug, Default)]
pub struct Neighbours {
    /// How many of the target's busy-polling connections are awake:
    /// handling PDUs, or polling, rather than waiting in `epoll_wait`.
    awake: AtomicUsize,
    run_queue: RunQueue,
}

impl Neighbours {
    /// The neighbours of connections on this machine.
    pub fn of_this_machine() -> Neighbours {
        Neighbours {
            awake: AtomicUsize::new(0),
            run_queue: RunQueue::of_this_machine(),
        }
    }

    fn awake(&self) -> usize {
        self.awake.load(Ordering::Relaxed)
    }
}

/// The machine's demand for CPU: how many threads are runnable (running or
/// waiting for a CPU) against how many CPUs are online. The kernel writes
/// `/proc/loadavg` afresh on each read, so one positioned read of an open
/// descriptor (about 2 us, see [`RUN_QUEUE_EVERY`]) gives the count of that
/// instant.
/// Without the file (no procfs) nothing is known, and nothing is reported
/// as oversubscribed.
#[derive(Debug, Default)]
pub struct RunQueue {
    loadavg: Option<File>,
    cpus: usize,
}

impl RunQueue {
    /// This machine's run queue, from `/proc/loadavg` and the online CPUs
    /// of `/proc/stat`.
    pub fn of_this_machine() -> RunQueue {
        let cpus = std::fs::read("/proc/stat")
            .map(|stat| online_cpus(&stat))
            .unwrap_or(0);
        if cpus == 0 {
            return RunQueue::default();
        }
        RunQueue::at(Path::new("/proc/loadavg"), cpus)
    }

    /// The run queue of a machine with `cpus` online CPUs whose runnable
    /// threads are counted in `loadavg` (a file in `/proc/loadavg`'s
    /// format).
    pub fn at(loadavg: &Path, cpus: usize) -> RunQueue {
        RunQueue {
            loadavg: File::open(loadavg).ok(),
            cpus,
        }
    }

    /// True when more threads are runnable than there are CPUs: some
    /// thread is waiting for one.
    fn oversubscribed(&self) -> bool {
        let Some(file) = &self.loadavg else {
            return false;
        };
        let mut line = [0u8; 128];
        match file.read_at(&mut line, 0) {
            Ok(n) => runnable_threads(&line[..n]).is_some_and(|r| r > self.cpus),
            Err(_) => false,
        }
    }
}

/// The runnable threads of a `/proc/loadavg` line: the part before the
/// slash of its fourth field ("0.20 0.18 0.12 3/250 4242", proc(5)).
fn runnable_threads(loadavg: &[u8]) -> Option<usize> {
    let field = loadavg
        .split(u8::is_ascii_whitespace)
        .filter(|f| !f.is_empty())
        .nth(3)?;
    let slash = field.iter().position(|&b| b == b'/')?;
    std::str::from_utf8(&field[..slash]).ok()?.parse().ok()
}

/// The online CPUs of a `/proc/stat`: one line each, `cpu` and its number
/// (the line of the sum has no number).
fn online_cpus(stat: &[u8]) -> usize {
    stat.split(|&b| b == b'\n')
        .filter(|line| line.starts_with(b"cpu") && line.get(3).is_some_and(u8::is_ascii_digit))
        .count()
}

/// How a busy poll ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollEnd {
    /// The socket has something for the reader.
    Readable,
    /// Not polled: reads bring several PDUs, the connection rests, the
    /// initiator has responses to handle, or another connection is awake.
    Skipped,
    /// Some thread of the machine waits for a CPU.
    MachineFull,
    /// Another thread took this CPU between looks: the connection rests.
    Contended,
    /// The budget ran out with nothing to read.
    BudgetSpent,
}

/// One connection's busy poll: its socket (a duplicate of the descriptor,
/// so that the writer task may own the stream) and its budget.
#[derive(Debug)]
pub struct BusyPoll {
    socket: OwnedFd,
    budget: Duration,
    /// The writer's next StatSN, and the ExpStatSN of the last PDU read.
    next_stat_sn: NextStatSn,
    exp_stat_sn: Option<u32>,
    /// The target's other connections and the machine's other threads;
    /// this connection is counted among the awake while `awake`.
    neighbours: Arc<Neighbours>,
    awake: bool,
    /// Set when another task wanted this CPU during a poll: no polling
    /// until then.
    rest_until: Option<Instant>,
    /// PDUs per socket read, a moving average in sixteenths.
    pdus_per_read_x16: u32,
}

impl BusyPoll {
    /// Busy polling of `stream` for up to `budget` per wait; `next_stat_sn`
    /// is what the connection's writer publishes; `neighbours` are shared
    /// by the target's connections (this one is counted awake at first).
    pub fn new(
        stream: &TcpStream,
        budget: Duration,
        next_stat_sn: NextStatSn,
        neighbours: Arc<Neighbours>,
    ) -> io::Result<BusyPoll> {
        let socket = stream.as_fd().try_clone_to_owned()?;
        neighbours.awake.fetch_add(1, Ordering::Relaxed);
        Ok(BusyPoll {
            socket,
            budget: budget.min(BUSY_POLL_MAX),
            next_stat_sn,
            exp_stat_sn: None,
            neighbours,
            awake: true,
            rest_until: None,
            pdus_per_read_x16: 16,
        })
    }

    /// Yields to the runtime (so that the responses already queued are
    /// sent), then looks for something to read until the budget runs out,
    /// giving the CPU to any other runnable thread between looks
    /// (`sched_yield`). If one took it, the CPU is not idle without the
    /// poll: the poll ends and the connection does not poll for [`REST`].
    /// The poll also ends when some thread of the machine waits for a CPU.
    /// Connections whose reads bring several PDUs, and initiators that
    /// have not yet seen every response, are not polled for.
    ///
    /// [`PollEnd::Readable`] when the socket has bytes, an end of stream or
    /// an error to report (the reader finds out which), even on a full
    /// machine: reading them holds no CPU that another thread waits for.
    pub async fn until_readable(&mut self) -> PollEnd {
        if self.pdus_per_read_x16 >= POLL_BELOW_PDUS_PER_READ * 16 {
            return PollEnd::Skipped;
        }
        if let Some(until) = self.rest_until {
            if Instant::now() < until {
                return PollEnd::Skipped;
            }
            self.rest_until = None;
        }
        let deadline = Instant::now() + self.budget;
        let mut first = true;
        let mut run_queue_seen: Option<Instant> = None;
        loop {
            tokio::task::yield_now().await;
            // Asked after the first yield, once the writer has sent (and
            // numbered) what the last read produced.
            if std::mem::take(&mut first) && self.initiator_is_behind() {
                return PollEnd::Skipped;
            }
            if self.others_awake() {
                return PollEnd::Skipped;
            }
            // What came is handled whatever the machine's load: only the
            // spin, not the reading, holds a CPU that others may want.
            if self.readable_now() {
                return PollEnd::Readable;
            }
            let now = Instant::now();
            if run_queue_seen.is_none_or(|at| now.duration_since(at) >= RUN_QUEUE_EVERY) {
                if self.neighbours.run_queue.oversubscribed() {
                    // A thread woken elsewhere while this CPU spins waits
                    // in another CPU's queue: give this CPU up to it. No
                    // rest: the count is of one instant (a kernel worker
                    // that runs for microseconds counts too), and on a
                    // machine that stays full every poll ends at its
                    // first look.
                    return PollEnd::MachineFull;
                }
                run_queue_seen = Some(now);
            }
            if now >= deadline {
                return PollEnd::BudgetSpent;
            }
            // Let whatever else is runnable on this CPU (the initiator
            // itself, when it shares the CPU) run before the next look.
            std::thread::yield_now();
            if now.elapsed() >= CONTENDED {
                // Something else ran: this CPU has work without the poll.
                // Sleep in epoll instead, and leave the CPU to the others
                // for a while.
                self.rest_until = Some(Instant::now() + REST);
                return PollEnd::Contended;
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

    /// The connection goes to wait in `epoll_wait`.
    pub fn sleeps(&mut self) {
        if std::mem::replace(&mut self.awake, false) {
            self.neighbours.awake.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The connection woke up to handle what came.
    pub fn wakes(&mut self) {
        if !std::mem::replace(&mut self.awake, true) {
            self.neighbours.awake.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the connection's socket reads bring more than one PDU on
    /// average (the initiator keeps several commands in flight). Not much
    /// more: a spin between batches of two makes the next read bring one
    /// (qemu-nbd's WRITEs at QD32 read 1.6-1.9 PDUs at a time).
    pub fn reads_bring_several(&self) -> bool {
        self.pdus_per_read_x16 >= 18
    }

    /// True when no other connection of the target is awake.
    pub fn alone_awake(&self) -> bool {
        !self.others_awake()
    }

    /// True when another connection of the target is awake.
    fn others_awake(&self) -> bool {
        self.neighbours.awake() > usize::from(self.awake)
    }

    /// Notes the ExpStatSN of a PDU the initiator sent.
    pub fn note_exp_stat_sn(&mut self, exp_stat_sn: u32) {
        self.exp_stat_sn = Some(exp_stat_sn);
    }

    /// True when the initiator's last PDU left responses unacknowledged
    /// besides the latest one (which it may well not have had yet): it
    /// has those to handle before it waits on the target. Serial number
    /// arithmetic (RFC 1982); an ExpStatSN ahead of the writer is an
    /// initiator's error the machine deals with, and does not hold polling
    /// back.
    fn initiator_is_behind(&self) -> bool {
        let Some(exp) = self.exp_stat_sn else {
            return false;
        };
        let unacknowledged = self.next_stat_sn.get().wrapping_sub(exp) as i32;
        unacknowledged > 1
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

impl Drop for BusyPoll {
    fn drop(&mut self) {
        self.sleeps();
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
            if poll.until_readable().await == PollEnd::Readable {
                return true;
            }
        }
        false
    }

    /// A poll of `server` with `budget`, its writer at StatSN 1, counted
    /// alone among the awake connections.
    fn poll_of(server: &TcpStream, budget: Duration) -> BusyPoll {
        BusyPoll::new(server, budget, NextStatSn::new(1), Arc::default()).unwrap()
    }

    /// A poll of `server` with the longest budget, its writer at StatSN 1,
    /// sharing `neighbours`.
    fn poll_among(server: &TcpStream, neighbours: &Arc<Neighbours>) -> BusyPoll {
        BusyPoll::new(
            server,
            BUSY_POLL_MAX,
            NextStatSn::new(1),
            neighbours.clone(),
        )
        .unwrap()
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
        let mut poll = poll_of(&server, Duration::from_micros(300));
        let start = Instant::now();
        // Unless another thread took this CPU (the poll then stops early
        // and rests), the whole budget went by.
        match poll.until_readable().await {
            PollEnd::BudgetSpent => assert!(start.elapsed() >= Duration::from_micros(300)),
            PollEnd::Contended => assert!(poll.rest_until.is_some(), "contended, no rest"),
            end => panic!("an idle socket's poll ended {end:?}"),
        }
    }

    #[tokio::test]
    async fn bytes_already_there_are_reported_and_left_for_the_reader() {
        let (mut client, server) = pair().await;
        client.write_all(b"PDU").await.unwrap();
        let mut poll = poll_of(&server, BUSY_POLL_MAX);
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
        let mut poll = poll_of(&server, BUSY_POLL_MAX);
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
        let mut poll = poll_of(&server, BUSY_POLL_MAX);
        let seen = readable_within(&mut poll).await;
        assert!(seen, "the peer closed, the poll kept waiting");
    }

    #[tokio::test]
    async fn a_resting_connection_does_not_poll() {
        let (mut client, server) = pair().await;
        client.write_all(b"PDU").await.unwrap();
        let mut poll = poll_of(&server, BUSY_POLL_MAX);
        poll.rest_until = Some(Instant::now() + Duration::from_secs(60));
        for _ in 0..100 {
            assert_eq!(
                poll.until_readable().await,
                PollEnd::Skipped,
                "polled while resting"
            );
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
        let mut poll = poll_of(&server, BUSY_POLL_MAX);
        for _ in 0..16 {
            poll.note_read(7);
        }
        for _ in 0..100 {
            assert_eq!(
                poll.until_readable().await,
                PollEnd::Skipped,
                "polled at 7 PDUs per read"
            );
        }
        for _ in 0..32 {
            poll.note_read(1);
        }
        assert!(readable_within(&mut poll).await, "one PDU per read again");
    }

    #[tokio::test]
    async fn reads_of_one_pdu_are_not_several_and_of_one_or_two_are() {
        let (_client, server) = pair().await;
        let mut poll = poll_of(&server, BUSY_POLL_MAX);
        for _ in 0..64 {
            poll.note_read(1);
        }
        assert!(!poll.reads_bring_several(), "QD1: one PDU per read");
        for i in 0..64 {
            poll.note_read(1 + i % 2);
        }
        assert!(poll.reads_bring_several(), "1.5 PDUs per read");
        for _ in 0..64 {
            poll.note_read(1);
        }
        assert!(!poll.reads_bring_several(), "back to one per read");
    }

    #[tokio::test]
    async fn an_initiator_with_responses_to_handle_is_not_polled_for() {
        let (mut client, server) = pair().await;
        client.write_all(b"PDU").await.unwrap();
        let next = NextStatSn::new(10);
        let mut poll = BusyPoll::new(&server, BUSY_POLL_MAX, next.clone(), Arc::default()).unwrap();
        // The writer numbered responses 10 to 14; the initiator's last PDU
        // acknowledged up to 11 (ExpStatSN 12): 12 to 14 are still its to
        // handle.
        next.set(15);
        poll.note_exp_stat_sn(12);
        for _ in 0..100 {
            assert_eq!(
                poll.until_readable().await,
                PollEnd::Skipped,
                "polled for a busy initiator"
            );
        }
        // Only the latest response unacknowledged (a QD1 round trip in
        // progress), then none: it waits on the target.
        poll.note_exp_stat_sn(14);
        assert!(readable_within(&mut poll).await, "initiator caught up");
        poll.note_exp_stat_sn(15);
        assert!(
            readable_within(&mut poll).await,
            "every response acknowledged"
        );
        // StatSN wraps (serial arithmetic): 2^32 - 2 acknowledged, the writer
        // at 1: three behind.
        next.set(1);
        poll.note_exp_stat_sn(u32::MAX - 1);
        assert_eq!(
            poll.until_readable().await,
            PollEnd::Skipped,
            "behind across the wrap"
        );
    }

    #[tokio::test]
    async fn no_connection_polls_while_another_is_awake() {
        let (mut client, server) = pair().await;
        client.write_all(b"PDU").await.unwrap();
        let (_other_client, other_server) = pair().await;
        let neighbours = Arc::new(Neighbours::default());
        let mut poll = poll_among(&server, &neighbours);
        let mut other = poll_among(&other_server, &neighbours);
        assert_eq!(neighbours.awake(), 2);
        for _ in 0..100 {
            assert_eq!(
                poll.until_readable().await,
                PollEnd::Skipped,
                "polled while another was at work"
            );
        }
        // The other waits in epoll (twice told: counted once): this one
        // polls and finds its bytes.
        other.sleeps();
        other.sleeps();
        assert_eq!(neighbours.awake(), 1);
        assert!(readable_within(&mut poll).await, "alone awake, bytes there");
        other.wakes();
        assert_eq!(
            poll.until_readable().await,
            PollEnd::Skipped,
            "the other woke up"
        );
        // A connection that ends is no longer counted.
        drop(other);
        assert_eq!(neighbours.awake(), 1);
        poll.sleeps();
        assert_eq!(neighbours.awake(), 0);
        drop(poll);
        assert_eq!(neighbours.awake(), 0, "dropped asleep, not taken off twice");
    }

    #[tokio::test]
    async fn no_connection_polls_while_a_thread_of_the_machine_waits_for_a_cpu() {
        let (mut client, server) = pair().await;
        let dir = tempfile::tempdir().unwrap();
        let loadavg = dir.path().join("loadavg");
        // Two CPUs, three runnable threads (the polling one among them):
        // one waits.
        std::fs::write(&loadavg, "1.92 1.40 0.99 3/211 5150\n").unwrap();
        let neighbours = Arc::new(Neighbours {
            awake: AtomicUsize::new(0),
            run_queue: RunQueue::at(&loadavg, 2),
        });
        let mut poll = poll_among(&server, &neighbours);
        // Nothing to read: a spin would hold a CPU someone waits for, so
        // the poll ends at its first look, every time, and takes no rest
        // (the next wait looks at the run queue again).
        for _ in 0..100 {
            assert_eq!(poll.until_readable().await, PollEnd::MachineFull);
            assert_eq!(poll.rest_until, None, "rested on one instant's count");
        }
        // The file is read afresh: two runnable on two CPUs is room
        // enough, and the poll spins (until its budget, or until another
        // thread takes this CPU).
        std::fs::write(&loadavg, "1.92 1.40 0.99 2/211 5150\n").unwrap();
        let end = poll.until_readable().await;
        assert!(
            matches!(end, PollEnd::BudgetSpent | PollEnd::Contended),
            "room again, nothing to read: {end:?}"
        );
        // Bytes already there are reported on a full machine as well:
        // reading them takes no CPU from the waiting thread, a spin would.
        std::fs::write(&loadavg, "1.92 1.40 0.99 3/211 5150\n").unwrap();
        poll.rest_until = None;
        client.write_all(b"PDU").await.unwrap();
        assert!(
            readable_within(&mut poll).await,
            "bytes there, machine full"
        );
    }

    #[test]
    fn run_queue_of_this_machine_counts_its_cpus() {
        let run_queue = RunQueue::of_this_machine();
        assert!(run_queue.loadavg.is_some(), "/proc/loadavg not opened");
        let parallelism = std::thread::available_parallelism().unwrap().get();
        assert!(
            run_queue.cpus >= parallelism,
            "{} online CPUs, {parallelism} usable",
            run_queue.cpus
        );
    }

    #[test]
    fn loadavg_lines_give_their_runnable_threads() {
        assert_eq!(runnable_threads(b"0.00 0.01 0.05 1/80 6679\n"), Some(1));
        assert_eq!(runnable_threads(b"12.5  9.1 3.0\t17/1024 99"), Some(17));
        assert_eq!(runnable_threads(b"0.00 0.01 0.05"), None);
        assert_eq!(runnable_threads(b"0.00 0.01 0.05 80 6679"), None);
        assert_eq!(runnable_threads(b"0.00 0.01 0.05 x/80 6679"), None);
        assert_eq!(runnable_threads(b""), None);
    }

    #[test]
    fn stat_gives_its_online_cpus() {
        let stat = b"cpu  10 0 5 100 0 0 0 0 0 0\ncpu0 5 0 2 50 0 0 0 0 0 0\n\
                     cpu1 5 0 3 50 0 0 0 0 0 0\nintr 12 0 3\nctxt 99\ncpus 1\n";
        assert_eq!(online_cpus(stat), 2);
        assert_eq!(online_cpus(b""), 0);
    }

    proptest::proptest! {
        /// Whatever the file holds, reading it never panics, and a
        /// well-formed line gives back its count.
        #[test]
        fn runnable_threads_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..128)) {
            let _ = runnable_threads(&bytes);
            let _ = online_cpus(&bytes);
        }

        #[test]
        fn well_formed_lines_round_trip(runnable in 0usize..100_000, total in 0usize..1_000_000, pid in 0u32..4_000_000) {
            let line = format!("0.10 0.20 0.30 {runnable}/{total} {pid}\n");
            proptest::prop_assert_eq!(runnable_threads(line.as_bytes()), Some(runnable));
        }
    }

    #[tokio::test]
    async fn the_budget_is_capped() {
        let (_client, server) = pair().await;
        let poll = poll_of(&server, Duration::from_secs(5));
        assert_eq!(poll.budget, BUSY_POLL_MAX);
    }
}
