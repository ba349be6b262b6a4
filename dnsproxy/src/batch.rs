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
//! The buffers are allocated once per socket task. The system calls' header arrays
//! (`nix::MultiHeaders`) hold raw pointers, so they cannot be kept in a task (across an
//! `.await` in a `Send` future): they are kept per thread instead, used only inside the
//! synchronous call, and allocated once per thread. A receive or send allocates nothing.
//!
//! Reusing `recvmmsg` headers needs care: nix sets each header's buffer pointers on every
//! call but not the address and control lengths, which the kernel shrinks to what the last
//! datagram in that slot used. So receive headers are kept per socket family (every source
//! address of a socket has its family's length; IPv6 sockets are v6-only or connected) and
//! per use of the original destination (whose control message has one size per family);
//! should a control message ever come back cut or missing, that thread's headers are dropped
//! and made again for the next call. `sendmmsg` sets every length it uses on each call.

use std::cell::RefCell;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrIn, SockaddrIn6, SockaddrStorage,
    recvmmsg, sendmmsg,
};

use crate::udp::UdpSocket;

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
    /// Whether the socket is IPv6, once known (it picks the thread's headers).
    v6: Option<bool>,
    /// The last receive read fewer than [`RECV_BATCH`] datagrams: the socket was empty.
    drained: bool,
}

/// Receive buffers kept per thread for the next [`RecvBatch`], at most.
const SPARE_BUFS: usize = 4;

thread_local! {
    /// Buffers of receivers that ended, for the next ones on this thread: a rotated upstream
    /// socket gets a new receiver every few thousand queries, and 2 MiB made and zeroed again
    /// each time showed in profiles (`memset`, the kernel clearing pages).
    static RECV_BUFS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

impl Drop for RecvBatch {
    fn drop(&mut self) {
        let bufs = std::mem::take(&mut self.bufs);
        // At thread exit the list may be gone already: the buffer is then simply freed.
        let _ = RECV_BUFS.try_with(|spare| {
            if let Ok(mut spare) = spare.try_borrow_mut()
                && spare.len() < SPARE_BUFS
            {
                spare.push(bufs);
            }
        });
    }
}

impl RecvBatch {
    pub(crate) fn new(orig_dst: bool) -> Self {
        // A kept buffer holds old datagrams: harmless, only the lengths received are read.
        let spare = RECV_BUFS
            .try_with(|spare| spare.try_borrow_mut().ok().and_then(|mut s| s.pop()))
            .ok()
            .flatten();
        Self {
            bufs: spare.unwrap_or_else(|| vec![0u8; RECV_BATCH * MAX_DATAGRAM]),
            got: Vec::with_capacity(RECV_BATCH),
            orig_dst,
            v6: None,
            drained: false,
        }
    }

    /// Reads what the socket holds, up to [`RECV_BATCH`] datagrams, without waiting
    /// (`WouldBlock` when there is nothing; tokio's readiness is cleared then). Returns how
    /// many were read; a datagram without a readable source is skipped.
    pub(crate) fn try_recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        let v6 = match self.v6 {
            Some(v6) => v6,
            None => *self.v6.insert(socket.local_addr()?.is_ipv6()),
        };
        let Self {
            bufs,
            got,
            orig_dst,
            ..
        } = self;
        got.clear();
        let kind = HeaderKind {
            v6,
            orig_dst: *orig_dst,
        };
        // A short batch means the socket is empty: tokio's readiness is cleared then (by
        // answering `WouldBlock` to `try_io`), which spares the `recvmmsg` that would only
        // say `EAGAIN`. Safe: tokio clears it only if no readiness event came since, and a
        // datagram that arrives later raises a new edge-triggered event.
        let mut read = 0;
        let result = socket.try_read(|| {
            read = recv_into(socket.as_raw_fd(), bufs, got, kind)?;
            if read < RECV_BATCH {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(())
            }
        });
        self.drained = read < RECV_BATCH;
        match result {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && read > 0 => Ok(got.len()),
            Err(e) => Err(e),
            Ok(()) => Ok(got.len()),
        }
    }

    /// Whether the last [`RecvBatch::try_recv`] found the socket empty after what it read (the
    /// caller waits for readiness again instead of calling it once more).
    pub(crate) fn drained(&self) -> bool {
        self.drained
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

/// Which of a thread's `recvmmsg` headers a socket uses.
#[derive(Debug, Clone, Copy)]
struct HeaderKind {
    v6: bool,
    orig_dst: bool,
}

impl HeaderKind {
    fn index(self) -> usize {
        usize::from(self.v6) * 2 + usize::from(self.orig_dst)
    }
}

thread_local! {
    /// This thread's `recvmmsg` headers, by [`HeaderKind::index`], made on first use.
    static RECV_HEADERS: RefCell<[Option<MultiHeaders<SockaddrStorage>>; 4]> =
        const { RefCell::new([None, None, None, None]) };
    /// This thread's `sendmmsg` headers ([`SEND_BATCH`] of them, made on first use) and
    /// destinations.
    static SEND: RefCell<SendHeaders> = const {
        RefCell::new(SendHeaders {
            headers: None,
            addrs: Vec::new(),
        })
    };
}

/// What a thread keeps for `sendmmsg`.
struct SendHeaders {
    headers: Option<MultiHeaders<SockaddrStorage>>,
    /// The destinations of the call being made.
    addrs: Vec<Option<SockaddrStorage>>,
}

/// Reads up to [`RECV_BATCH`] datagrams into `bufs` and `got`; returns how many the kernel
/// gave (a datagram without a readable source is not put in `got`).
fn recv_into(
    fd: std::os::fd::RawFd,
    bufs: &mut [u8],
    got: &mut Vec<Received>,
    kind: HeaderKind,
) -> io::Result<usize> {
    let orig_dst = kind.orig_dst;
    RECV_HEADERS.with_borrow_mut(|cache| {
        let mut chunks = bufs.chunks_exact_mut(MAX_DATAGRAM);
        let mut slices: [[IoSliceMut<'_>; 1]; RECV_BATCH] =
            std::array::from_fn(|_| [IoSliceMut::new(chunks.next().unwrap_or_default())]);
        let slot = &mut cache[kind.index()];
        let headers = slot.get_or_insert_with(|| {
            let cmsg = orig_dst.then(|| nix::cmsg_space!(nix::libc::sockaddr_in6));
            MultiHeaders::preallocate(RECV_BATCH, cmsg)
        });
        let results = recvmmsg(fd, headers, slices.iter_mut(), MsgFlags::MSG_DONTWAIT, None)?;
        // A control message cut or missing: this slot's control length shrank (see the
        // module's note); the headers are made again for the next call.
        let mut remake = false;
        let mut read = 0;
        for msg in results {
            read += 1;
            let Some(from) = msg.address.as_ref().and_then(to_socket_addr) else {
                continue;
            };
            let mut orig = None;
            if orig_dst {
                if let Ok(cmsgs) = msg.cmsgs() {
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
                remake |= orig.is_none() || msg.flags.contains(MsgFlags::MSG_CTRUNC);
            }
            got.push(Received {
                len: msg.bytes.min(MAX_DATAGRAM),
                from,
                orig_dst: orig,
            });
        }
        if remake {
            *slot = None;
        }
        Ok(read)
    })
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
            // Not through the reactor: the socket is registered for reads only (crate::udp).
            let sent = send_from(socket.as_raw_fd(), &self.data, &self.msgs, next);
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
    let count = end - first;
    let mut start = if first == 0 { 0 } else { msgs[first - 1].0 };
    let mut slices = [[IoSlice::new(&[])]; SEND_BATCH];
    for (slice, &(stop, _)) in slices.iter_mut().zip(&msgs[first..end]) {
        *slice = [IoSlice::new(&data[start..stop])];
        start = stop;
    }
    SEND.with_borrow_mut(|SendHeaders { headers, addrs }| {
        let headers = headers.get_or_insert_with(|| MultiHeaders::preallocate(SEND_BATCH, None));
        addrs.clear();
        addrs.extend(
            msgs[first..end]
                .iter()
                .map(|&(_, to)| to.map(SockaddrStorage::from)),
        );
        let results = sendmmsg(
            fd,
            headers,
            &slices[..count],
            &addrs[..],
            [],
            MsgFlags::MSG_DONTWAIT,
        )?;
        Ok(results.count())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receivers_buffers_serve_the_next_receiver_on_its_thread() {
        let first = RecvBatch::new(false);
        let ptr = first.bufs.as_ptr();
        drop(first);
        let second = RecvBatch::new(true);
        assert_eq!(second.bufs.as_ptr(), ptr, "reused, not made again");
        assert_eq!(second.bufs.len(), RECV_BATCH * MAX_DATAGRAM);
        // Another thread makes its own.
        let other = std::thread::spawn(|| RecvBatch::new(false).bufs.len())
            .join()
            .unwrap();
        assert_eq!(other, RECV_BATCH * MAX_DATAGRAM);
    }

    /// A short batch clears the socket's readiness (no `recvmmsg` only to hear `EAGAIN`), and
    /// a datagram that arrives afterwards makes it ready again; a full batch does not.
    #[tokio::test]
    async fn a_short_batch_marks_the_socket_drained_and_the_next_datagram_wakes_it() {
        use futures_util::FutureExt as _;
        let to = UdpSocket::bind("127.0.0.1:0").unwrap();
        let from = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = to.local_addr().unwrap();
        let mut batch = RecvBatch::new(false);
        for i in 0..RECV_BATCH + 2 {
            from.send_to(&[u8::try_from(i).unwrap()], addr)
                .await
                .unwrap();
        }
        let mut read = 0;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while read < RECV_BATCH + 2 {
            assert!(tokio::time::Instant::now() < deadline, "only {read} read");
            to.readable().await.unwrap();
            match batch.try_recv(&to) {
                Ok(n) => {
                    // Full batches are not drained; the last, short one is.
                    assert_eq!(batch.drained(), n < RECV_BATCH);
                    read += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => assert!(batch.drained()),
                Err(e) => panic!("{e}"),
            }
        }
        assert!(batch.drained());
        assert!(
            to.readable().now_or_never().is_none(),
            "readiness cleared by the short batch"
        );
        from.send_to(b"late", addr).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(60), to.readable())
            .await
            .expect("a later datagram makes the socket ready again")
            .unwrap();
        assert_eq!(batch.try_recv(&to).unwrap(), 1);
        assert_eq!(batch.get(0).unwrap().1, b"late");
    }

    #[tokio::test]
    async fn a_batch_goes_out_in_order_and_comes_in_in_one_receive() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
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

    /// The thread's receive headers serve an IPv4 and an IPv6 socket in turn: every source
    /// address comes back whole (a header shared across families would cut the IPv6 one to
    /// the IPv4 length the kernel left in it).
    #[tokio::test]
    async fn headers_reused_across_families_read_every_source_whole() {
        let v4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        let v6 = UdpSocket::bind("[::1]:0").unwrap();
        let from4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        let from6 = UdpSocket::bind("[::1]:0").unwrap();
        let (mut b4, mut b6) = (RecvBatch::new(false), RecvBatch::new(false));
        for round in 0..3u8 {
            for (to, from, batch) in [(&v4, &from4, &mut b4), (&v6, &from6, &mut b6)] {
                from.send_to(&[round], to.local_addr().unwrap())
                    .await
                    .unwrap();
                let n = loop {
                    to.readable().await.unwrap();
                    match batch.try_recv(to) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("{e}"),
                    }
                };
                assert_eq!(n, 1);
                let (got, bytes) = batch.get(0).unwrap();
                assert_eq!(got.from, from.local_addr().unwrap(), "round {round}");
                assert_eq!(bytes, [round]);
            }
        }
    }

    /// A datagram whose original destination the kernel did not report (the socket option
    /// is off) drops the thread's headers for that kind, so the next receive makes them
    /// again; once the option is on, the original destination is read, for either family.
    #[tokio::test]
    async fn a_missing_original_destination_remakes_the_headers() {
        use nix::sys::socket::{setsockopt, sockopt};
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let to = UdpSocket::bind(bind).unwrap();
            let from = UdpSocket::bind(bind).unwrap();
            let to_addr = to.local_addr().unwrap();
            let kind = HeaderKind {
                v6: to_addr.is_ipv6(),
                orig_dst: true,
            };
            let headers_kept = || RECV_HEADERS.with_borrow(|cache| cache[kind.index()].is_some());
            let mut batch = RecvBatch::new(true);
            let mut receive = async |round: u8| {
                from.send_to(&[round], to_addr).await.unwrap();
                loop {
                    to.readable().await.unwrap();
                    match batch.try_recv(&to) {
                        Ok(n) => {
                            assert_eq!(n, 1);
                            let (got, bytes) = batch.get(0).unwrap();
                            assert_eq!(bytes, [round]);
                            return got.orig_dst;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            };
            assert_eq!(receive(0).await, None, "{bind}: the option is off");
            assert!(
                !headers_kept(),
                "{bind}: headers dropped after a missing one"
            );
            if to_addr.is_ipv6() {
                setsockopt(&to, sockopt::Ipv6OrigDstAddr, &true).unwrap();
            } else {
                setsockopt(&to, sockopt::Ipv4OrigDstAddr, &true).unwrap();
            }
            for round in 1..3 {
                assert_eq!(receive(round).await, Some(to_addr), "{bind}, round {round}");
                assert!(headers_kept(), "{bind}: headers kept while whole");
            }
        }
    }
}
