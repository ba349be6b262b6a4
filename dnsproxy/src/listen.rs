//! Client-facing sockets: UDP listeners sharing a port through SO_REUSEPORT, and TCP
//! listeners with RFC 7766 pipelining.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::batch::RecvBatch;
use crate::error::Error;
use crate::framing::{FrameReader, Next};
use crate::policy::Transport;
use crate::proxy::{BATCH, ERROR_PAUSE, Handled, Round, Shared, Worker, is_transient};
use crate::transparent;
use crate::udp::{UdpSocket, Watcher};
use crate::upstream::{ReplyTo, TcpOut, TcpReply};

/// Queries one TCP connection may have in flight at once; reading pauses past it.
pub(crate) const TCP_PIPELINE: usize = 128;

/// Why a listener could not be made: the socket call failed, or `IP_TRANSPARENT` was refused.
#[derive(Debug)]
pub(crate) enum BindError {
    Io(io::Error),
    Transparent(io::Error),
}

impl From<io::Error> for BindError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

impl BindError {
    /// The proxy's error for listener `addr`, naming the missing capability for EPERM.
    pub(crate) fn into_error(self, transport: Transport, addr: SocketAddr) -> Error {
        match self {
            Self::Transparent(source) if source.kind() == io::ErrorKind::PermissionDenied => {
                Error::MissingCapability {
                    what: match transport {
                        Transport::Udp => "set IP_TRANSPARENT on the UDP listener",
                        Transport::Tcp | Transport::Dot | Transport::Doh => {
                            "set IP_TRANSPARENT on the TCP listener"
                        }
                    },
                    addr,
                    capability: "CAP_NET_ADMIN or CAP_NET_RAW",
                    error: source,
                }
            }
            Self::Io(source) | Self::Transparent(source) => Error::Bind {
                transport,
                addr,
                error: source,
            },
        }
    }
}

/// Binds one UDP socket with SO_REUSEPORT (IPv6 sockets are v6-only, so `0.0.0.0` and `[::]`
/// can both be listed). Transparent: with `IP_TRANSPARENT`, reporting each datagram's original
/// destination.
pub(crate) fn bind_udp(
    addr: SocketAddr,
    transparent: bool,
    watcher: Watcher,
) -> Result<UdpSocket, BindError> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    if transparent {
        transparent::set_transparent(&socket).map_err(BindError::Transparent)?;
        transparent::enable_orig_dst(&socket, addr.is_ipv6())?;
    }
    socket.set_reuse_port(true)?;
    // Bursts of queries must not overflow the default buffer; best effort.
    let _ = socket.set_recv_buffer_size(4 << 20);
    socket.bind(&SockAddr::from(addr))?;
    socket.set_nonblocking(true)?;
    Ok(UdpSocket::new(socket.into(), watcher)?)
}

/// Binds one TCP listener (with `IP_TRANSPARENT` when `transparent`: an accepted connection's
/// local address is then the destination the client dialled).
pub(crate) fn bind_tcp(addr: SocketAddr, transparent: bool) -> Result<TcpListener, BindError> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    if transparent {
        transparent::set_transparent(&socket).map_err(BindError::Transparent)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&SockAddr::from(addr))?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket.into())?)
}

/// Serves one UDP listener socket: after each readiness wake, reads until the socket is empty,
/// up to [`crate::batch::RECV_BATCH`] datagrams per `recvmmsg`; the queries a batch forwards leave in one
/// `sendmmsg` per upstream socket and its replies in one `sendmmsg`, after the batch. In
/// transparent mode each datagram's original destination is the query's server (the
/// listener's address if the kernel reported none).
pub(crate) async fn udp_loop(shared: Arc<Shared>, index: usize) -> Result<(), Error> {
    let mut server = UdpServer::new(shared, index);
    loop {
        server.readable().await?;
        while server.round().await.again().await {}
    }
}

/// One UDP listener socket's reader: its receive batch and its worker.
pub(crate) struct UdpServer {
    shared: Arc<Shared>,
    index: usize,
    batch: RecvBatch,
    worker: Worker,
}

impl UdpServer {
    pub(crate) fn new(shared: Arc<Shared>, index: usize) -> Self {
        let batch = RecvBatch::new(shared.config.transparent);
        let worker = Worker::batching(index, shared.udp.len());
        Self {
            shared,
            index,
            batch,
            worker,
        }
    }

    /// The listener socket.
    pub(crate) fn socket(&self) -> &UdpSocket {
        &self.shared.udp[self.index].socket
    }

    /// Waits until the reactor says the socket has datagrams.
    async fn readable(&self) -> Result<(), Error> {
        let listener = &self.shared.udp[self.index];
        listener
            .socket
            .readable()
            .await
            .map_err(|source| Error::Listener {
                transport: Transport::Udp,
                addr: listener.local,
                error: source,
            })
    }

    /// Reads and handles batches of queries until the socket is empty or [`BATCH`] were
    /// handled. Awaits only a send that finds its socket's buffer full.
    pub(crate) async fn round(&mut self) -> Round {
        let Self {
            shared,
            index,
            batch,
            worker,
        } = self;
        let index = *index;
        let listener = &shared.udp[index];
        let local = listener.local;
        let transparent = shared.config.transparent;
        let mut handled = 0;
        loop {
            let n = match batch.try_recv(&listener.socket) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Round::Drained,
                Err(e) if is_transient(&e) => continue,
                Err(e) => {
                    tracing::warn!(addr = %local, error = %e, "DNS UDP listener error");
                    return Round::Failed;
                }
            };
            // The batch's queries arrived by now: one clock read for them all.
            worker.batch_received = Some(tokio::time::Instant::now());
            for i in 0..n {
                let Some((got, raw)) = batch.get(i) else {
                    break;
                };
                let client = got.from;
                let server = if transparent {
                    got.orig_dst.unwrap_or(local)
                } else {
                    local
                };
                let outcome = shared
                    .handle_query(worker, raw, client, server, Transport::Udp, || {
                        ReplyTo::Udp {
                            listener: index,
                            server,
                        }
                    })
                    .await;
                if outcome == Handled::Reply {
                    if shared.needs_raw(index, server) {
                        shared
                            .send_udp_reply(index, server, &worker.scratch, client)
                            .await;
                    } else {
                        worker.replies.push(index, &worker.scratch, client);
                    }
                }
            }
            shared.flush(worker).await;
            if batch.drained() {
                return Round::Drained;
            }
            handled += n;
            if handled >= BATCH {
                return Round::More;
            }
        }
    }
}

/// Accepts TCP clients up to `max_tcp_connections`; past it new connections are closed at
/// once. When the process has no file descriptor left (EMFILE, ENFILE) a waiting client is
/// accepted with the descriptor kept in reserve and closed at once (see [`shed_one`]).
pub(crate) async fn tcp_accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    local: SocketAddr,
) -> Result<(), Error> {
    let slots = Arc::new(Semaphore::new(shared.config.max_tcp_connections));
    let mut connections = JoinSet::new();
    let mut spare = reserve_fd();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) if is_fd_exhausted(&e) => {
                shed_one(&shared, &listener, local, &mut spare, &e).await;
                continue;
            }
            // A connection reset before accept, …: keep serving.
            Err(e) => {
                tracing::warn!(addr = %local, error = %e, "DNS TCP accept failed");
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        if spare.is_none() {
            // Descriptors are back: keep one in reserve again.
            spare = reserve_fd();
        }
        while connections.try_join_next().is_some() {}
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            shared.metrics.tcp_refused.inc();
            tracing::debug!(client = %peer, "DNS TCP connection refused: too many open");
            drop(stream);
            continue;
        };
        connections.spawn(tcp_connection(shared.clone(), stream, peer, local, permit));
    }
}

/// A file descriptor held in reserve for [`shed_one`] (`/dev/null`, read-only); `None` if even
/// that cannot be opened.
pub(crate) fn reserve_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Whether accept failed for want of a file descriptor (the process's or the system's).
pub(crate) fn is_fd_exhausted(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == nix::errno::Errno::EMFILE as i32 || code == nix::errno::Errno::ENFILE as i32
    )
}

/// Out of file descriptors: the connection at the head of the backlog is accepted with the
/// reserve descriptor and closed at once, so its client sees the connection closed instead of
/// hanging in the backlog, and the listener stops being readable for it (otherwise accept
/// fails again at once and the loop spins). Then the reserve is taken back. Counted as
/// `fd_exhausted`, logged at most every [`crate::proxy::WARN_EVERY`]. UDP needs no new
/// descriptor and goes on being served.
pub(crate) async fn shed_one(
    shared: &Shared,
    listener: &TcpListener,
    local: SocketAddr,
    spare: &mut Option<std::fs::File>,
    error: &io::Error,
) {
    let now = tokio::time::Instant::now();
    if shared.warn_due(&shared.fd_warned_ms, now) {
        tracing::warn!(addr = %local, error = %error, "no file descriptor left: new DNS TCP clients are refused (UDP is still served)");
    }
    if spare.take().is_none() {
        // No reserve to give up: wait rather than spin, and try to get one back.
        tokio::time::sleep(ERROR_PAUSE).await;
        *spare = reserve_fd();
        return;
    }
    // One attempt, without waiting: the client may have gone meanwhile.
    let accepted = std::future::poll_fn(|cx| match listener.poll_accept(cx) {
        std::task::Poll::Ready(result) => std::task::Poll::Ready(Some(result)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await;
    match accepted {
        Some(Ok((stream, peer))) => {
            shared.metrics.tcp_refused_fd_exhausted.inc();
            tracing::debug!(client = %peer, "DNS TCP connection closed: no file descriptor left");
            drop(stream);
        }
        // Another thread took the descriptor (or the system has none): pause, not spin.
        Some(Err(_)) => tokio::time::sleep(ERROR_PAUSE).await,
        None => {}
    }
    *spare = reserve_fd();
}

/// Serves one TCP client (see [`serve_stream`]), counted in `tcp_open`.
async fn tcp_connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    client: SocketAddr,
    listen: SocketAddr,
    _permit: OwnedSemaphorePermit,
) {
    shared.tcp_open.fetch_add(1, Ordering::Relaxed);
    // For a redirected connection the local address is the resolver the client dialled.
    let server = stream.local_addr().unwrap_or(listen);
    let _ = stream.set_nodelay(true);
    let idle = shared.config.tcp_idle_timeout;
    serve_stream(&shared, stream, client, server, Transport::Tcp, idle).await;
    shared.tcp_open.fetch_sub(1, Ordering::Relaxed);
}

/// Serves one stream client (TCP, or DoT once the TLS handshake is done): queries are read
/// and handled as they come (up to [`TCP_PIPELINE`] at once), replies written as they finish,
/// in any order (RFC 7766 §6.2.1.1, RFC 7858 §3.3). The connection closes after `idle`
/// without a query while nothing is in flight.
pub(crate) async fn serve_stream<S>(
    shared: &Arc<Shared>,
    stream: S,
    client: SocketAddr,
    server: SocketAddr,
    transport: Transport,
    idle: std::time::Duration,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::unbounded_channel::<TcpOut>();
    let pipeline = Semaphore::new(TCP_PIPELINE);

    let reader = {
        let (shared, pipeline) = (&shared, &pipeline);
        async move {
            let mut worker = Worker::new(0);
            let mut frames = FrameReader::default();
            loop {
                // Handle every whole message received.
                loop {
                    let len = match frames.next() {
                        Next::Message(len) => len,
                        Next::NeedMore => break,
                        Next::Empty => return,
                    };
                    let Ok(slot) = pipeline.acquire().await else {
                        return;
                    };
                    slot.forget();
                    let raw = frames.message(len);
                    let handled = shared
                        .handle_query(&mut worker, raw, client, server, transport, || {
                            ReplyTo::Tcp(TcpReply::new(tx.clone()))
                        })
                        .await;
                    match handled {
                        Handled::Forwarded => {}
                        Handled::Reply => {
                            let _ = tx.send(Some(worker.scratch.clone()));
                        }
                        Handled::Dropped => {
                            let _ = tx.send(None);
                        }
                        // Shorter than a header: the client's framing cannot be trusted any
                        // more. BIND resets such a connection (`isc_nm_bad_request`); here
                        // reading stops, as after a zero-length prefix, and the connection
                        // closes once the queries already in flight are answered.
                        Handled::Runt => {
                            let _ = tx.send(None);
                            return;
                        }
                    }
                    frames.consume(len);
                }
                match tokio::time::timeout(idle, rd.read(frames.spare())).await {
                    Ok(Ok(0) | Err(_)) => return,
                    Ok(Ok(n)) => frames.filled(n),
                    // Idle: close unless queries are still in flight.
                    Err(_) if pipeline.available_permits() == TCP_PIPELINE => return,
                    Err(_) => {}
                }
            }
        }
    };

    let writer = {
        let pipeline = &pipeline;
        async move {
            let mut out = Vec::with_capacity(4096);
            while let Some(first) = rx.recv().await {
                let mut done = 0;
                let mut next = Some(first);
                while let Some(message) = next {
                    done += 1;
                    if let Some(reply) = message
                        && let Ok(len) = u16::try_from(reply.len())
                    {
                        out.extend_from_slice(&len.to_be_bytes());
                        out.extend_from_slice(&reply);
                    }
                    next = rx.try_recv().ok();
                }
                if !out.is_empty() {
                    if wr.write_all(&out).await.is_err() {
                        pipeline.close();
                        return;
                    }
                    out.clear();
                }
                pipeline.add_permits(done);
            }
            let _ = wr.shutdown().await;
        }
    };

    tokio::join!(reader, writer);
}
