//! Per-command state timers (GMBlock paper Fig. 15; the synchronized-sends
//! paper's TSC timers), an in-memory histogram
//! per state, and the debug counter of bytes copied by user space.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The five states of a READ (the GMBlock paper's per-request states,
/// Fig. 15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// STATE_INIT: command received, buffer and ops set up and submitted.
    Init = 0,
    /// STATE_READ: submission to the last chunk valid.
    DiskRead = 1,
    /// STATE_SEND_INIT: first chunk valid to the first send posted.
    SendSetup = 2,
    /// STATE_SEND: disk done to the last send done, the network time not
    /// overlapped with the disk.
    SendUnoverlapped = 3,
    /// STATE_FIN: last send to finished (status sent).
    Fin = 4,
    /// Received to finished.
    Total = 5,
}

/// Every phase, in order.
pub const PHASES: [Phase; 6] = [
    Phase::Init,
    Phase::DiskRead,
    Phase::SendSetup,
    Phase::SendUnoverlapped,
    Phase::Fin,
    Phase::Total,
];

impl Phase {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Init => "init",
            Phase::DiskRead => "disk_read",
            Phase::SendSetup => "send_setup",
            Phase::SendUnoverlapped => "send_unoverlapped",
            Phase::Fin => "fin",
            Phase::Total => "total",
        }
    }
}

/// Instants of one command. Unset instants collapse onto their neighbours.
#[derive(Debug, Clone, Copy)]
pub struct CommandTimers {
    /// Command received.
    pub received: Instant,
    /// Disk ops submitted.
    pub submitted: Option<Instant>,
    /// First chunk valid.
    pub first_valid: Option<Instant>,
    /// First send started.
    pub first_send: Option<Instant>,
    /// Last chunk valid.
    pub disk_done: Option<Instant>,
    /// Last send returned.
    pub last_send_done: Option<Instant>,
    /// Status sent.
    pub finished: Option<Instant>,
}

impl CommandTimers {
    /// Starts the clock at `received`.
    pub fn new(received: Instant) -> CommandTimers {
        CommandTimers {
            received,
            submitted: None,
            first_valid: None,
            first_send: None,
            disk_done: None,
            last_send_done: None,
            finished: None,
        }
    }

    /// Duration of `p`.
    pub fn phase(&self, p: Phase) -> Duration {
        let sub = self.submitted.unwrap_or(self.received);
        let disk = self.disk_done.unwrap_or(sub);
        let fv = self.first_valid.unwrap_or(disk);
        let fs = self.first_send.unwrap_or(fv);
        let ls = self.last_send_done.unwrap_or(disk).max(disk);
        let fin = self.finished.unwrap_or(ls);
        match p {
            Phase::Init => sub - self.received,
            Phase::DiskRead => disk.saturating_duration_since(sub),
            Phase::SendSetup => fs.saturating_duration_since(fv),
            Phase::SendUnoverlapped => ls.saturating_duration_since(disk),
            Phase::Fin => fin.saturating_duration_since(ls),
            Phase::Total => fin.saturating_duration_since(self.received),
        }
    }
}

/// A lock-free histogram of durations in power-of-two nanosecond buckets.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; 48],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Adds one sample.
    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        let b = (64 - ns.leading_zeros() as usize).min(47);
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
    /// Samples so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
    /// Sum of every sample.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns.load(Ordering::Relaxed))
    }
    /// Mean.
    pub fn mean(&self) -> Duration {
        let n = self.count().max(1);
        Duration::from_nanos(self.sum_ns.load(Ordering::Relaxed) / n)
    }
    /// Upper bound of the bucket holding quantile `q` (0..=1).
    pub fn quantile(&self, q: f64) -> Duration {
        let n = self.count();
        if n == 0 {
            return Duration::ZERO;
        }
        let want = ((n as f64) * q).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            acc += b.load(Ordering::Relaxed);
            if acc >= want {
                return Duration::from_nanos(if i == 0 { 0 } else { (1u64 << i) - 1 });
            }
        }
        Duration::MAX
    }
}

/// Histograms of every phase over many commands, plus copy totals.
#[derive(Debug, Default)]
pub struct PhaseStats {
    hist: [Histogram; 6],
    /// Bytes moved by finished commands.
    pub bytes: AtomicU64,
    /// Bytes copied by user space (memcpy in our code).
    pub user_copied: AtomicU64,
    /// Bytes copied by the kernel on our behalf (read/write through a user
    /// buffer: socket writes, buffered reads).
    pub kernel_copied: AtomicU64,
}

impl PhaseStats {
    /// Adds one finished command.
    pub fn record(&self, t: &CommandTimers, bytes: u64, cost: CopyCost) {
        for p in PHASES {
            self.hist[p as usize].record(t.phase(p));
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.user_copied
            .fetch_add(cost.user as u64, Ordering::Relaxed);
        self.kernel_copied
            .fetch_add(cost.kernel as u64, Ordering::Relaxed);
    }
    /// The histogram of `p`.
    pub fn histogram(&self, p: Phase) -> &Histogram {
        &self.hist[p as usize]
    }
    /// One line: mean per phase in microseconds.
    pub fn summary(&self) -> String {
        PHASES
            .iter()
            .map(|&p| {
                format!(
                    "{}={:.0}us",
                    p.name(),
                    self.histogram(p).mean().as_secs_f64() * 1e6
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Bytes copied to move some data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyCost {
    /// By user space (memcpy in our code).
    pub user: usize,
    /// By the kernel between a user buffer and a kernel buffer.
    pub kernel: usize,
}

impl std::ops::AddAssign for CopyCost {
    fn add_assign(&mut self, o: CopyCost) {
        self.user += o.user;
        self.kernel += o.kernel;
    }
}

/// Process-wide debug counter of bytes copied by user space on the data
/// path (every command adds its own count).
pub static USER_COPIED_BYTES: AtomicU64 = AtomicU64::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_and_histogram() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let t = CommandTimers {
            received: t0,
            submitted: Some(t0 + ms(1)),
            first_valid: Some(t0 + ms(2)),
            first_send: Some(t0 + ms(3)),
            disk_done: Some(t0 + ms(10)),
            last_send_done: Some(t0 + ms(12)),
            finished: Some(t0 + ms(13)),
        };
        assert_eq!(t.phase(Phase::DiskRead), ms(9));
        assert_eq!(t.phase(Phase::SendUnoverlapped), ms(2));
        assert_eq!(t.phase(Phase::Total), ms(13));
        let h = Histogram::default();
        for i in 1..=100 {
            h.record(Duration::from_micros(i));
        }
        assert_eq!(h.count(), 100);
        assert!(h.quantile(0.5) >= Duration::from_micros(50));
        assert!(h.quantile(0.5) < Duration::from_micros(200));
    }
}
