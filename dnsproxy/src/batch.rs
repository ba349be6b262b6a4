//! Batched UDP I/O: `recvmmsg` reads up to [`RECV_BATCH`] datagrams in one system call and
//! `sendmmsg` sends a queue of datagrams in one, on the client side (listeners) and on the
//! upstream side (connected sockets) alike.
//!
//! Why `nix` (already a dependency, safe wrappers over both calls) and not `quinn-udp`:
//! quinn-udp batches receives but sends one `sendmsg` per datagram (its batching on the send
//! side is GSO, which needs one destination and equal sizes: replies go to many clients, and
//! queries differ in length), it does not read `IP_RECVORIGDSTADDR` (the transparent mode's
//! original destination, port included), and it sets socket options (GRO, ECN, PKTINFO) the
//! proxy has no use for.
//!
//! The buffers are allocated once per socket task; a receive or send allocates only the
//! system call's header array (`nix::MultiHeaders`, which holds raw pointers and so cannot be
//! kept across an `.await` in a `Send` task): once per batch, not per datagram.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrIn, SockaddrIn6, SockaddrStorage,
    recvmmsg, sendmmsg,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Datagrams read by one `recvmmsg`.
pub(crate) const RECV_BATCH: usize = 32;

/// The largest datagram (a UDP payload cannot be longer).
pub(crate) const MAX_DATAGRAM: usize = 65_536;

/// One datagram of a received batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received {
    /// Its length in its buffer.
    pub(crate) len: usize,
    /// Its source.
    pub(crate) from: SocketAddr,
    /// Its original destination, when asked for and reported (transparent mode).
    pub(crate) orig_dst: Option<SocketAddr>,
}

/// Buffers for [`RECV_BATCH`] datagrams and what the last receive put in them.
pub(crate) struct RecvBatch {
    /// `RECV_BATCH` buffers of [`MAX_DATAGRAM`] bytes, one after the other (allocated zeroed:
    /// the kernel maps the pages on first use, so memory follows the datagrams' sizes).
    bufs: Vec<u8>,
    got: Vec<Received>,
    /// Read each datagram's original destination (`IP_RECVORIGDSTADDR` must be on).
    orig_dst: bool,
}

impl RecvBatch {
    pub(crate) fn new(orig_dst: bool) -> Self {
        Self {
            bufs: vec![0u8; RECV_BATCH * MAX_DATAGRAM],
            got: Vec::with_capacity(RECV_BATCH),
            orig_dst,
        }
    }

    /// Reads what the socket holds, up to [`RECV_BATCH`] datagrams, without waiting
    /// (`WouldBlock` when there is nothing; tokio's readiness is cleared then). Returns how
    /// many were read; a datagram without a readable source is skipped.
    pub(crate) fn try_recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        let Self {
            bufs,
            got,
            orig_dst,
        } = self;
        got.clear();
        socket.try_io(Interest::READABLE, || {
            recv_into(socket.as_raw_fd(), bufs, got, *orig_dst)
        })?;
        Ok(got.len())
    }

    /// Datagram `i` of the last receive, with its bytes (mutable: the proxy rewrites IDs in
    /// place).
    pub(crate) fn get(&mut self, i: usize) -> Option<(Received, &mut [u8])> {
        let received = *self.got.get(i)?;
        let start = i * MAX_DATAGRAM;
        let buf = self.bufs.get_mut(start..start + received.len)?;
        Some((received, buf))
    }
}

fn recv_into(
    fd: std::os::fd::RawFd,
    bufs: &mut [u8],
    got: &mut Vec<Received>,
    orig_dst: bool,
) -> io::Result<()> {
    let cmsg = orig_dst.then(|| nix::cmsg_space!(nix::libc::sockaddr_in6));
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(RECV_BATCH, cmsg);
    let mut slices: Vec<[IoSliceMut<'_>; 1]> = bufs
        .chunks_exact_mut(MAX_DATAGRAM)
        .map(|b| [IoSliceMut::new(b)])
        .collect();
    let results = recvmmsg(
        fd,
        &mut headers,
        slices.iter_mut(),
        MsgFlags::MSG_DONTWAIT,
        None,
    )?;
    for msg in results {
        let Some(from) = msg.address.as_ref().and_then(to_socket_addr) else {
            continue;
        };
        let mut orig = None;
        if orig_dst && let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                match c {
                    ControlMessageOwned::Ipv4OrigDstAddr(a) => {
                        orig = Some(SockaddrIn::from(a).into());
                    }
                    ControlMessageOwned::Ipv6OrigDstAddr(a) => {
                        orig = Some(SockaddrIn6::from(a).into());
                    }
                    _ => {}
                }
            }
        }
        got.push(Received {
            len: msg.bytes.min(MAX_DATAGRAM),
            from,
            orig_dst: orig,
        });
    }
    Ok(())
}

pub(crate) fn to_socket_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::from(*v4));
    }
    addr.as_sockaddr_in6().map(|v6| SocketAddr::from(*v6))
}

/// Datagrams waiting to be sent in one `sendmmsg`: their bytes one after the other, and per
/// datagram its end and destination (`None` on a connected socket).
#[derive(Default)]
pub(crate) struct SendBatch {
    data: Vec<u8>,
    msgs: Vec<(usize, Option<SocketAddr>)>,
}

/// Datagrams sent by one `sendmmsg` at most (the kernel's `UIO_MAXIOV` is 1024).
const SEND_BATCH: usize = 64;

impl SendBatch {
    pub(crate) fn push(&mut self, bytes: &[u8], to: Option<SocketAddr>) {
        self.data.extend_from_slice(bytes);
        self.msgs.push((self.data.len(), to));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Sends every queued datagram on `socket`, waiting for buffer space only when the socket
    /// is full. A datagram the kernel refuses (after one more try: a pending ICMP error is
    /// reported once, on whatever is sent next) is dropped and reported to `failed`; the rest
    /// go on. The queue is empty afterwards.
    pub(crate) async fn flush(
        &mut self,
        socket: &UdpSocket,
        mut failed: impl FnMut(Option<SocketAddr>, &io::Error),
    ) {
        let mut next = 0;
        let mut retried = false;
        while next < self.msgs.len() {
            let sent = socket.try_io(Interest::WRITABLE, || {
                send_from(socket.as_raw_fd(), &self.data, &self.msgs, next)
            });
            match sent {
                Ok(n) if n > 0 => {
                    next += n.min(self.msgs.len() - next);
                    retried = false;
                }
                Ok(_) => {
                    if let Err(e) = socket.writable().await {
                        failed(None, &e);
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Err(e) = socket.writable().await {
                        failed(None, &e);
                        break;
                    }
                }
                Err(_) if !retried => retried = true,
                Err(e) => {
                    failed(self.msgs[next].1, &e);
                    next += 1;
                    retried = false;
                }
            }
        }
        self.data.clear();
        self.msgs.clear();
    }
}

/// One `sendmmsg` of the datagrams from `first` on (at most [`SEND_BATCH`]); how many left.
fn send_from(
    fd: std::os::fd::RawFd,
    data: &[u8],
    msgs: &[(usize, Option<SocketAddr>)],
    first: usize,
) -> io::Result<usize> {
    let end = msgs.len().min(first + SEND_BATCH);
    let mut start = if first == 0 { 0 } else { msgs[first - 1].0 };
    let mut slices: Vec<[IoSlice<'_>; 1]> = Vec::with_capacity(end - first);
    let mut addrs: Vec<Option<SockaddrStorage>> = Vec::with_capacity(end - first);
    for &(stop, to) in &msgs[first..end] {
        slices.push([IoSlice::new(&data[start..stop])]);
        addrs.push(to.map(SockaddrStorage::from));
        start = stop;
    }
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(slices.len(), None);
    let results = sendmmsg(
        fd,
        &mut headers,
        &slices,
        &addrs,
        [],
        MsgFlags::MSG_DONTWAIT,
    )?;
    Ok(results.count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_batch_goes_out_in_order_and_comes_in_in_one_receive() {
        let a = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let b_addr = b.local_addr().unwrap();
        let mut out = SendBatch::default();
        for i in 0..100u8 {
            out.push(&vec![i; usize::from(i) + 1], Some(b_addr));
        }
        out.flush(&a, |_, e| panic!("{e}")).await;
        assert!(out.is_empty());
        let mut batch = RecvBatch::new(false);
        let mut seen = 0u8;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while seen < 100 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {seen} received"
            );
            b.readable().await.unwrap();
            let n = match batch.try_recv(&b) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("{e}"),
            };
            assert!(n <= RECV_BATCH);
            for i in 0..n {
                let (got, bytes) = batch.get(i).unwrap();
                assert_eq!(got.from, a.local_addr().unwrap());
                assert_eq!(bytes, &vec![seen; usize::from(seen) + 1][..]);
                seen += 1;
            }
        }
    }
}
