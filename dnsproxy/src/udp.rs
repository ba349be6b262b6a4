//! A UDP socket as the proxy drives it: registered with the reactor for reads only.
//!
//! tokio's `UdpSocket` registers for reads and writes. A socket registered for writes hears
//! of every datagram the kernel frees from its send buffer (`sock_wfree` raises `EPOLLOUT`):
//! on loopback during the send itself, so each send batch costs one more `epoll_wait` round
//! and a pass through the reactor; on a NIC at the transmit completion, which can wake a
//! sleeping thread for nothing. The proxy's sends do not wait on the common path (a UDP send
//! buffer is rarely full), so these sockets are registered for reads only, and a send that
//! does find the buffer full waits through a second registration, of a duplicate of the
//! descriptor for writes only, made for that wait and dropped after it.
//!
//! On a shard thread ([`crate::shards`]) no reactor watches the socket at all: the shard's own
//! `epoll` set says when it has datagrams, and a read is just the system call.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A non-blocking UDP socket, watched for reads by the current runtime's reactor or by a shard
/// thread.
#[derive(Debug)]
pub(crate) struct UdpSocket {
    io: Watched,
}

#[derive(Debug)]
enum Watched {
    /// Registered with a runtime's reactor for reads.
    Reactor(AsyncFd<std::net::UdpSocket>),
    /// Watched by a shard thread's `epoll` set, or by nobody: no registration here.
    Unregistered(std::net::UdpSocket),
}

/// Who tells the proxy that a socket has datagrams to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watcher {
    /// The reactor of the runtime the socket is made in.
    Reactor,
    /// A shard thread's `epoll` set ([`crate::shards`]).
    Shard,
    /// Nobody: a socket that only sends ([`crate::twin`]).
    Nobody,
}

/// Registers `socket` with the current runtime's reactor for `interest` only.
fn register(
    socket: std::net::UdpSocket,
    interest: Interest,
) -> io::Result<AsyncFd<std::net::UdpSocket>> {
    #[allow(
        deprecated,
        reason = "the I/O-safety concern is a wrapper that does not own its descriptor; \
                  std's UdpSocket owns it, and the replacement is unsafe, which this crate forbids"
    )]
    AsyncFd::with_interest(socket, interest)
}

impl UdpSocket {
    /// Takes `socket` (made non-blocking here), to be watched by `watcher`: with
    /// [`Watcher::Reactor`] it is registered for reads now, so this must be called within the
    /// runtime that will drive it.
    pub(crate) fn new(socket: std::net::UdpSocket, watcher: Watcher) -> io::Result<Self> {
        socket.set_nonblocking(true)?;
        let io = match watcher {
            Watcher::Reactor => Watched::Reactor(register(socket, Interest::READABLE)?),
            Watcher::Shard | Watcher::Nobody => Watched::Unregistered(socket),
        };
        Ok(Self { io })
    }

    fn std(&self) -> &std::net::UdpSocket {
        match &self.io {
            Watched::Reactor(io) => io.get_ref(),
            Watched::Unregistered(socket) => socket,
        }
    }

    /// Binds a socket to `addr` (tests).
    #[cfg(test)]
    pub(crate) fn bind(addr: &str) -> io::Result<Self> {
        Self::new(std::net::UdpSocket::bind(addr)?, Watcher::Reactor)
    }

    /// Waits until the reactor says the socket may be read. The readiness stays until a read
    /// through [`UdpSocket::try_read`] finds nothing.
    /// A socket a shard thread (or nobody) watches has no reactor to wait on: the wait fails
    /// at once.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        match &self.io {
            // Dropping the guard keeps the readiness for the reads that follow.
            Watched::Reactor(io) => io.readable().await.map(drop),
            Watched::Unregistered(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the socket is not watched by a reactor",
            )),
        }
    }

    /// Runs `read` if the reactor says the socket may be read; its `WouldBlock` clears that
    /// readiness (a read must return it only when the socket had nothing more). On a shard
    /// thread's socket: runs `read`.
    pub(crate) fn try_read<R>(&self, read: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        match &self.io {
            Watched::Reactor(io) => io.try_io(Interest::READABLE, |_| read()),
            Watched::Unregistered(_) => read(),
        }
    }

    /// Waits until the send buffer has room: through a registration for writes, of a
    /// duplicate of the descriptor, made now (the kernel reports a socket that is writable
    /// already at once) and dropped after.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        let dup = register(self.std().try_clone()?, Interest::WRITABLE)?;
        dup.writable().await.map(drop)
    }

    /// Sends one datagram without waiting (`WouldBlock` when the send buffer is full).
    pub(crate) fn try_send_to(&self, bytes: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.std().send_to(bytes, to)
    }

    /// Sends one datagram, waiting for room in the send buffer if there is none.
    pub(crate) async fn send_to(&self, bytes: &[u8], to: SocketAddr) -> io::Result<usize> {
        loop {
            match self.try_send_to(bytes, to) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                sent => return sent,
            }
        }
    }

    /// Sends one datagram to the connected peer without waiting (`WouldBlock` when the send
    /// buffer is full).
    pub(crate) fn try_send(&self, bytes: &[u8]) -> io::Result<usize> {
        self.std().send(bytes)
    }

    /// Sends one datagram to the connected peer, waiting for room if there is none.
    pub(crate) async fn send(&self, bytes: &[u8]) -> io::Result<usize> {
        loop {
            match self.try_send(bytes) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                sent => return sent,
            }
        }
    }

    /// The address the socket is bound to.
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.std().local_addr()
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.std().as_raw_fd()
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.std().as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    impl UdpSocket {
        fn reactor(&self) -> &AsyncFd<std::net::UdpSocket> {
            let Watched::Reactor(io) = &self.io else {
                panic!("not registered")
            };
            io
        }
    }

    #[tokio::test]
    async fn reads_wait_for_a_datagram_and_sends_go_out() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = b.local_addr().unwrap();
        let mut buf = [0u8; 16];
        // Nothing yet: the read says so (and clears the readiness, if any).
        let empty = b.try_read(|| b.std().recv_from(&mut buf));
        assert_eq!(
            empty.unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "nothing was sent yet"
        );
        assert_eq!(a.send_to(b"hello", to).await.unwrap(), 5);
        tokio::time::timeout(Duration::from_secs(10), b.readable())
            .await
            .expect("a sent datagram makes the socket readable")
            .unwrap();
        let (n, from) = b.try_read(|| b.std().recv_from(&mut buf)).unwrap();
        assert_eq!((&buf[..n], from), (&b"hello"[..], a.local_addr().unwrap()));
    }

    #[tokio::test]
    async fn a_wait_for_room_ends_when_there_is_room_and_the_socket_hears_no_write_readiness() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        // A writable socket: the wait ends at once, and leaves no registration behind.
        tokio::time::timeout(Duration::from_secs(10), b.writable())
            .await
            .expect("an empty send buffer has room")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), b.writable())
            .await
            .expect("the first wait's registration is gone")
            .unwrap();
        // The socket's own registration has no interest in writes: a send frees buffer
        // space (the kernel raises `EPOLLOUT`), yet no write readiness ever reaches it. With
        // a registration for writes too, the wait below would end at once: epoll reports a
        // writable socket as soon as it is registered.
        b.send_to(b"x", a.local_addr().unwrap()).await.unwrap();
        let mut buf = [0u8; 4];
        let got = a.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got], b"x");
        assert!(
            tokio::time::timeout(Duration::from_millis(200), b.reactor().writable())
                .await
                .is_err(),
            "a read-only registration reported write readiness"
        );
    }
}
