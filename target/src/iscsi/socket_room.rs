//! Waiting for room in a socket that sends with `MSG_ZEROCOPY`.
//!
//! The kernel tells of finished zero-copy sends on the socket's error
//! queue, which epoll reports as EPOLLERR. mio reads EPOLLERR as "the write
//! side is closed" (a pipe whose reader went away says little else), and
//! tokio keeps a closed state for good: from the first notification on,
//! every wait for the socket to be writable ends at once. A sender that
//! found the socket full (EAGAIN) then tried again and again without ever
//! sleeping, holding its thread busy until the initiator took data, and
//! for good if it never did (no timer on that thread could fire).
//!
//! So the room of such a socket is waited for on an epoll instance of its
//! own that watches the socket for room coming free (EPOLLOUT,
//! edge-triggered); tokio watches that instance, which reads as ready when
//! it holds an event and never as closed. A completion notification still
//! wakes a waiter, once per notification, never in a loop.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::event::{epoll, Timespec};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Waits for room in one socket, immune to the closed state above.
#[derive(Debug)]
pub struct SocketRoom {
    epoll: AsyncFd<OwnedFd>,
}

impl SocketRoom {
    /// Watches `socket` for room (within a tokio runtime, whose I/O driver
    /// then watches the epoll instance).
    pub fn watch(socket: impl AsFd) -> io::Result<SocketRoom> {
        let instance = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &instance,
            socket,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::OUT | epoll::EventFlags::ET,
        )?;
        // SAFETY: `instance` is an open epoll descriptor the AsyncFd owns
        // from here on: it stays open, and the same, until the AsyncFd
        // (which deregisters it first) drops it.
        let epoll = unsafe { AsyncFd::register_with_interest(instance, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(SocketRoom { epoll })
    }

    /// Waits for an event on the socket since the last wait: room coming
    /// free, or a notification (the caller tries its send again and, if
    /// the socket is still full, waits again).
    pub async fn wait(&self) -> io::Result<()> {
        let mut ready = self.epoll.readable().await?;
        // Take the events, so the instance reads as empty until the next
        // one: the readiness cleared below then stays clear.
        let mut events = [MaybeUninit::<epoll::Event>::uninit(); 4];
        let none = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        epoll::wait(self.epoll.get_ref(), &mut events[..], Some(&none))?;
        ready.clear_ready();
        Ok(())
    }

    /// Runs `send` (a non-blocking send) until it does not find the socket
    /// full, waiting for room between tries.
    pub async fn send(&self, mut send: impl FnMut() -> io::Result<usize>) -> io::Result<usize> {
        loop {
            match send() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait().await?,
                done => return done,
            }
        }
    }
}

/// Runs `send` on `stream` once it has room: by `room` for a socket that
/// sends with `MSG_ZEROCOPY`, by tokio's readiness for any other.
pub async fn send_when_room(
    stream: &TcpStream,
    room: Option<&SocketRoom>,
    send: impl FnMut() -> io::Result<usize>,
) -> io::Result<usize> {
    match room {
        Some(room) => room.send(send).await,
        None => stream.async_io(Interest::WRITABLE, send).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iscsi::zerocopy::ZeroCopy;
    use std::os::fd::AsRawFd;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    /// A loopback pair whose sender has `SO_ZEROCOPY` on.
    async fn pair() -> (TcpStream, TcpStream, ZeroCopy) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sender = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (receiver, _) = listener.accept().await.unwrap();
        let zc = ZeroCopy::enable(sender.as_raw_fd()).expect("SO_ZEROCOPY on a TCP socket");
        (sender, receiver, zc)
    }

    /// Fills the sender with zero-copy sends the receiver does not take,
    /// until it reports full.
    fn fill(sender: &TcpStream, chunk: &[u8]) {
        let fd = sender.as_raw_fd();
        let iov = [std::io::IoSlice::new(chunk)];
        loop {
            match crate::iscsi::zerocopy::sendmsg(fd, &iov, libc::MSG_ZEROCOPY) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[tokio::test]
    async fn a_full_zero_copy_socket_is_waited_on_not_spun_on() {
        let (sender, mut receiver, _zc) = pair().await;
        let room = SocketRoom::watch(&sender).unwrap();
        let chunk = vec![0x3c; 64 << 10];
        // Filled until it stays full: what is queued moves on to the
        // receiver's buffer until that too is full. Over the loopback
        // interface the kernel copies zero-copy payloads as they are
        // delivered and says so on the error queue: EPOLLERR.
        let iov = [std::io::IoSlice::new(&chunk)];
        loop {
            fill(&sender, &chunk);
            tokio::time::sleep(Duration::from_millis(50)).await;
            let fd = sender.as_raw_fd();
            match crate::iscsi::zerocopy::sendmsg(fd, &iov, libc::MSG_ZEROCOPY) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                sent => assert!(sent.is_ok(), "{sent:?}"),
            }
        }
        // What this module is for: tokio now reads the socket as writable
        // for good, though it is full.
        for _ in 0..3 {
            let writable = tokio::time::timeout(Duration::from_millis(100), sender.writable());
            assert!(
                writable.await.is_ok(),
                "tokio reads the full zero-copy socket as writable (if not, it no longer takes EPOLLERR for closed)"
            );
            let e = sender.try_write(&chunk).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        }
        // The room waiter sleeps until the receiver takes data (a stray
        // notification may wake it now and then, never in a loop).
        let mut wakes = 0u32;
        let counted = async {
            loop {
                room.wait().await.unwrap();
                wakes += 1;
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(300), counted).await;
        assert!(
            wakes < 10,
            "{wakes} wakes in 300 ms on a full socket: the waiter spins"
        );
        let sent = room
            .send(|| crate::iscsi::zerocopy::sendmsg(sender.as_raw_fd(), &iov, libc::MSG_ZEROCOPY));
        let reader = async {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                if receiver.read(&mut buf).await.unwrap() == 0 {
                    break;
                }
            }
        };
        tokio::select! {
            n = sent => assert!(n.unwrap() > 0, "sent once the receiver read"),
            _ = reader => panic!("the receiver's end closed"),
            _ = tokio::time::sleep(Duration::from_secs(10)) => panic!("no room within 10 s of the receiver reading"),
        }
    }
}
