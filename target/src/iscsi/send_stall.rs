//! How long a connection's writer waits on an initiator that takes no data.
//!
//! An initiator that takes none of what is sent for as long as it may leave
//! a NOP-In unanswered (the NOP timeout) is as gone as one that does not
//! answer: the writer gives up on it, and the connection ends, even with
//! pings off, where the READ data it holds would otherwise stay for good.
//!
//! What is limited is each wait for room in the socket, never a PDU or a
//! flush as a whole: a send that moves bytes starts the next wait afresh,
//! so a slow link that keeps taking bytes is never cut however long a large
//! READ's Data-In take. The bytes sent (and those of zero-copy sends the
//! initiator acknowledged) are counted, so that whoever waits on the writer
//! (the connection's reader, on a full queue) can tell a slow writer from a
//! stalled one. (A writer over an in-memory stream, in tests, has its
//! flush and shutdown limited whole.)

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// The limit on each of a writer's waits for room in its socket, and the
/// count of bytes it has sent.
#[derive(Debug, Clone, Default)]
pub struct StallLimit {
    limit: Option<Duration>,
    sent: Arc<AtomicU64>,
}

/// The error of a wait that ran out: the initiator took nothing for the
/// limit.
#[derive(Debug, thiserror::Error)]
#[error("the initiator took no data for {0:?}")]
struct Stalled(Duration);

/// Whether `e` is a writer's wait running out (not another time-out, such
/// as the socket's own or a file system's).
pub fn is_stall(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Stalled>())
}

impl StallLimit {
    /// Limits each wait to `limit` from now on (by default a wait lasts
    /// as long as it takes).
    pub fn set(&mut self, limit: Duration) {
        self.limit = Some(limit);
    }

    /// The count of bytes sent, shared: it moves while the initiator takes
    /// data.
    pub fn progress(&self) -> Arc<AtomicU64> {
        self.sent.clone()
    }

    /// Whether waits are limited.
    pub fn is_limited(&self) -> bool {
        self.limit.is_some()
    }

    /// Counts `bytes` the initiator took without a send of the writer's:
    /// zero-copy sends it acknowledged, whose buffers came back.
    pub fn count(&self, bytes: u64) {
        self.sent.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Runs `send` (a wait for room in the socket and the send after it),
    /// counting the bytes it sent; fails with a stall error when it waits
    /// longer than the limit.
    pub async fn send(
        &self,
        send: impl Future<Output = std::io::Result<usize>>,
    ) -> std::io::Result<usize> {
        let n = self.wait(send).await?;
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Runs `wait`, failing with a stall error when it takes longer than
    /// the limit.
    pub async fn wait<T>(
        &self,
        wait: impl Future<Output = std::io::Result<T>>,
    ) -> std::io::Result<T> {
        let Some(limit) = self.limit else {
            return wait.await;
        };
        // Most sends find room at once: they are spared the timer (a clock
        // read and a handle to the runtime's timer).
        let mut wait = std::pin::pin!(wait);
        let first = std::future::poll_fn(|cx| Poll::Ready(wait.as_mut().poll(cx))).await;
        if let Poll::Ready(r) = first {
            return r;
        }
        match tokio::time::timeout(limit, wait).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                Stalled(limit),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_limit_is_a_stall_and_sends_are_counted() {
        let mut stall = StallLimit::default();
        stall.set(Duration::from_secs(2));
        let progress = stall.progress();
        assert_eq!(stall.send(async { Ok(100) }).await.unwrap(), 100);
        let slow = async {
            tokio::time::sleep(Duration::from_millis(1999)).await;
            Ok(7)
        };
        assert_eq!(
            stall.send(slow).await.unwrap(),
            7,
            "a wait within the limit"
        );
        assert_eq!(progress.load(Ordering::Relaxed), 107);
        let began = tokio::time::Instant::now();
        let e = stall
            .send(std::future::pending::<std::io::Result<usize>>())
            .await
            .unwrap_err();
        assert!(is_stall(&e), "{e}");
        assert_eq!(began.elapsed(), Duration::from_secs(2));
        assert_eq!(e.to_string(), "the initiator took no data for 2s");
        assert_eq!(progress.load(Ordering::Relaxed), 107, "nothing counted");
        let other = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert!(!is_stall(&other), "a socket's own time-out is not a stall");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_limit_a_wait_lasts_as_long_as_it_takes() {
        let stall = StallLimit::default();
        let long = async {
            tokio::time::sleep(Duration::from_secs(86_400)).await;
            Ok(1)
        };
        assert_eq!(stall.send(long).await.unwrap(), 1);
    }
}
