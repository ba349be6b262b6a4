//! The proxy under test, a test policy, a recording observer and query log, DNS clients (UDP
//! and TCP) built on hickory-proto, and the waiting rules every test follows.
//!
//! Waiting: the suite runs on machines busy with other work, so
//! - nothing is asserted on wall time. A test about durations runs on tokio's paused clock
//!   (`#[tokio::test(start_paused = true)]`, a current-thread runtime shared by the proxy, the
//!   upstream and the client), moves it with [`tokio::time::advance`] and asserts on what
//!   happened at each step (the proxy reads tokio's clock);
//! - "wait for X" polls X (or awaits the future that yields it) with a deadline of
//!   [`PATIENCE`] of real time, generous enough that only a broken proxy reaches it;
//! - on a current-thread runtime every wait keeps yielding instead of sleeping: a paused clock
//!   auto-advances whenever the runtime is idle, even while a datagram is on its way through
//!   the kernel, which would let timeouts fire that the test did not ask for. Time then moves
//!   only when the test advances it;
//! - "X does not happen" is checked, where possible, by the order of events (a later reply
//!   arrives first, a counter that moves after X would have happened); otherwise over a short
//!   window ([`within`]), which a loaded machine can only make pass, never fail.

use std::collections::HashSet;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use fqdnd_dnsproxy::{
    Config, Direction, DnsProxy, Observation, ObserveError, ProxyStats, QueryInfo, QueryLog,
    QueryLogEntry, QueryPolicy, Recorded, Recorder, ResponseContext, ResponseObserver, StatsHandle,
    Taps, Transport, Verdict,
};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::{Semaphore, oneshot};

use crate::upstream::TestUpstream;

/// Clients from this address are unknown to the test policy.
pub(crate) const UNKNOWN_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// Denies names starting with `denied.`; clients from [`UNKNOWN_CLIENT`] are unknown; every
/// other query is allowed with tag 7.
pub(crate) struct TestPolicy;

impl QueryPolicy for TestPolicy {
    fn check(&self, query: &QueryInfo<'_>) -> Verdict {
        if query.client.ip() == UNKNOWN_CLIENT {
            Verdict::UnknownClient
        } else if query.name.starts_with("denied.") {
            Verdict::Deny { tag: 7 }
        } else {
            Verdict::Allow { tag: 7 }
        }
    }
}

/// What the observer saw of one answer.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    pub(crate) name: String,
    pub(crate) tag: u64,
    pub(crate) transport: Transport,
    pub(crate) rcode: hickory_proto::op::ResponseCode,
    pub(crate) truncated: bool,
    pub(crate) answers: usize,
    pub(crate) upstream: SocketAddr,
    /// The TTLs of the answer and authority records, in order.
    pub(crate) ttls: Vec<u32>,
}

/// How the observer answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `Done(Ok)` at once.
    Done,
    /// `Done(Err)`.
    Fail,
    /// `Pending` until the test calls [`TestObserver::release`] once per answer.
    Gated,
    /// `Pending` forever.
    Never,
}

/// Records every answer it is shown.
pub(crate) struct TestObserver {
    pub(crate) mode: Mutex<Mode>,
    pub(crate) seen: Mutex<Vec<Observed>>,
    gate: Arc<Semaphore>,
    /// Pending observations that finished.
    pub(crate) finished: Arc<AtomicU64>,
}

impl TestObserver {
    pub(crate) fn new(mode: Mode) -> Arc<Self> {
        Arc::new(Self {
            mode: Mutex::new(mode),
            seen: Mutex::new(Vec::new()),
            gate: Arc::new(Semaphore::new(0)),
            finished: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Lets one gated observation finish.
    pub(crate) fn release(&self) {
        self.gate.add_permits(1);
    }

    pub(crate) fn seen(&self) -> Vec<Observed> {
        self.seen.lock().unwrap().clone()
    }

    pub(crate) fn seen_name(&self, name: &str) -> Vec<Observed> {
        self.seen().into_iter().filter(|o| o.name == name).collect()
    }
}

impl ResponseObserver for TestObserver {
    fn observe(&self, answer: &ResponseContext<'_>) -> Observation {
        // Every section, TTLs as sent (the proxy decodes the answers only).
        let response = Message::from_vec(answer.bytes).expect("the observer gets a whole message");
        self.seen.lock().unwrap().push(Observed {
            name: answer.name.to_owned(),
            tag: answer.tag,
            transport: answer.transport,
            rcode: response.metadata.response_code,
            truncated: answer.response.header.truncated,
            answers: answer.response.answers.len(),
            upstream: answer.upstream,
            ttls: response
                .answers
                .iter()
                .chain(&response.authorities)
                .map(|r| r.ttl)
                .collect(),
        });
        match *self.mode.lock().unwrap() {
            Mode::Done => Observation::Done(Ok(())),
            Mode::Fail => Observation::Done(Err(ObserveError {
                reason: "test failure".into(),
            })),
            Mode::Gated => {
                let gate = self.gate.clone();
                let finished = self.finished.clone();
                Observation::Pending(Box::pin(async move {
                    gate.acquire().await.unwrap().forget();
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }))
            }
            Mode::Never => Observation::Pending(Box::pin(std::future::pending())),
        }
    }
}

/// Keeps every query log entry.
#[derive(Default)]
pub(crate) struct TestLog {
    pub(crate) entries: Mutex<Vec<QueryLogEntry>>,
}

impl QueryLog for TestLog {
    fn record(&self, entry: QueryLogEntry) {
        self.entries.lock().unwrap().push(entry);
    }
}

/// One recorded message, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) direction: Direction,
    pub(crate) client: SocketAddr,
    pub(crate) server: SocketAddr,
    pub(crate) transport: Transport,
    pub(crate) bytes: Vec<u8>,
    pub(crate) tag: Option<u64>,
    pub(crate) redirected: bool,
    pub(crate) verdict: &'static str,
}

/// Keeps every recorded message while switched on (off at first).
#[derive(Default)]
pub(crate) struct TestRecorder {
    pub(crate) on: std::sync::atomic::AtomicBool,
    pub(crate) taken: Mutex<Vec<Taken>>,
}

impl Recorder for TestRecorder {
    fn active(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    fn record(&self, m: &Recorded<'_>) {
        self.taken.lock().unwrap().push(Taken {
            direction: m.direction,
            client: m.client,
            server: m.server,
            transport: m.transport,
            bytes: m.bytes.to_vec(),
            tag: m.tag,
            redirected: m.redirected,
            verdict: m.verdict,
        });
    }
}

/// Test defaults: loopback, port 0, short health checks. The upstream timeout is long enough
/// that a loaded machine does not turn an answer into a timeout on the real clock; a test about
/// timeouts sets its own (and runs on the paused clock where it asserts durations).
///
/// On a multi-thread test runtime the UDP path runs on two shard threads of its own, as in the
/// daemon; on a current-thread one (the paused clock) on the test's runtime (`udp_threads: 0`),
/// whose clock the test moves.
pub(crate) fn test_config(upstreams: Vec<SocketAddr>) -> Config {
    let current_thread =
        Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::CurrentThread);
    Config {
        listen_udp: vec!["127.0.0.1:0".parse().unwrap()],
        listen_tcp: vec!["127.0.0.1:0".parse().unwrap()],
        udp_sockets_per_address: 2,
        udp_threads: if current_thread { 0 } else { 2 },
        upstreams: upstreams.into_iter().map(Into::into).collect(),
        upstream_sockets: 2,
        upstream_timeout: Duration::from_secs(2),
        health_check_interval: Duration::from_millis(200),
        health_check_failures: 3,
        response_max_delay: Duration::from_secs(2),
        tcp_idle_timeout: Duration::from_secs(5),
        ..Config::default()
    }
}

/// A running proxy in front of one [`TestUpstream`].
pub(crate) struct Harness {
    pub(crate) udp: SocketAddr,
    pub(crate) tcp: SocketAddr,
    /// The first DoT and DoH listeners, when the config has them.
    pub(crate) dot: Option<SocketAddr>,
    pub(crate) doh: Option<SocketAddr>,
    pub(crate) upstream: TestUpstream,
    pub(crate) observer: Arc<TestObserver>,
    pub(crate) log: Arc<TestLog>,
    pub(crate) recorder: Arc<TestRecorder>,
    stats: StatsHandle,
    shutdown: Option<oneshot::Sender<()>>,
    run: Option<tokio::task::JoinHandle<Result<(), fqdnd_dnsproxy::Error>>>,
}

impl Harness {
    /// Starts an upstream and a proxy with [`test_config`] changed by `tweak`.
    pub(crate) async fn start(mode: Mode, tweak: impl FnOnce(&mut Config)) -> Self {
        let upstream = TestUpstream::start().await;
        let mut config = test_config(vec![upstream.addr]);
        tweak(&mut config);
        Self::with(upstream, config, mode).await
    }

    pub(crate) async fn with(upstream: TestUpstream, config: Config, mode: Mode) -> Self {
        Self::with_policy(upstream, config, mode, Arc::new(TestPolicy)).await
    }

    /// Like [`Harness::with`] with another policy.
    pub(crate) async fn with_policy(
        upstream: TestUpstream,
        config: Config,
        mode: Mode,
        policy: Arc<dyn QueryPolicy>,
    ) -> Self {
        let observer = TestObserver::new(mode);
        let log = Arc::new(TestLog::default());
        let recorder = Arc::new(TestRecorder::default());
        let taps = Taps {
            query_log: Some(log.clone()),
            recorder: Some(recorder.clone()),
        };
        let proxy = DnsProxy::bind(config, policy, observer.clone(), taps)
            .await
            .unwrap();
        let udp = proxy.udp_addrs()[0];
        let tcp = proxy.tcp_addrs()[0];
        let dot = proxy.dot_addrs().first().copied();
        let doh = proxy.doh_addrs().first().copied();
        let stats = proxy.stats_handle();
        let (tx, rx) = oneshot::channel();
        let run = tokio::spawn(proxy.run(async move {
            let _ = rx.await;
        }));
        Self {
            udp,
            tcp,
            dot,
            doh,
            upstream,
            observer,
            log,
            recorder,
            stats,
            shutdown: Some(tx),
            run: Some(run),
        }
    }

    pub(crate) fn stats(&self) -> ProxyStats {
        self.stats.stats()
    }

    /// The stats once nothing is in flight (a reply leaves just before its query is
    /// counted).
    pub(crate) async fn settled(&self) -> ProxyStats {
        assert!(
            eventually(|| self.stats().inflight == 0).await,
            "queries still in flight: {:?}",
            self.stats()
        );
        self.stats()
    }

    /// Stops the proxy and checks `run` returned `Ok`.
    pub(crate) async fn stop(mut self) {
        let _ = self.shutdown.take().unwrap().send(());
        let run = self.run.take().unwrap();
        patiently(run).await.unwrap().unwrap();
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A query for `name`/`qtype` with RD=1, a random ID, and an OPT record when `edns` is given
/// (payload size, DO bit).
pub(crate) fn query(name: &str, qtype: RecordType, edns: Option<(u16, bool)>) -> Vec<u8> {
    let mut msg = Message::new(fastish_id(), MessageType::Query, OpCode::Query);
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if let Some((payload, dnssec_ok)) = edns {
        let mut e = Edns::new();
        e.set_max_payload(payload);
        e.set_dnssec_ok(dnssec_ok);
        e.options_mut().insert(EdnsOption::Unknown(
            u16::from(EdnsCode::Unknown(65_001)),
            b"fqdnd".to_vec(),
        ));
        msg.set_edns(e);
    }
    msg.to_vec().unwrap()
}

fn fastish_id() -> u16 {
    static NEXT: AtomicU64 = AtomicU64::new(0x1234);
    #[allow(clippy::cast_possible_truncation, reason = "wraps on purpose")]
    let id = NEXT.fetch_add(7919, Ordering::Relaxed) as u16;
    id
}

/// A UDP client socket on `ip`.
pub(crate) async fn udp_client(ip: IpAddr) -> UdpSocket {
    UdpSocket::bind(SocketAddr::new(ip, 0)).await.unwrap()
}

/// Sends `raw` over UDP from 127.0.0.1 and waits for one reply.
pub(crate) async fn udp_exchange(server: SocketAddr, raw: &[u8]) -> Vec<u8> {
    let socket = udp_client(IpAddr::V4(Ipv4Addr::LOCALHOST)).await;
    socket.send_to(raw, server).await.unwrap();
    udp_recv(&socket).await
}

/// The next datagram on `socket` (panics after [`PATIENCE`]).
pub(crate) async fn udp_recv(socket: &UdpSocket) -> Vec<u8> {
    let mut buf = vec![0u8; 65_536];
    let (n, _) = patiently(socket.recv_from(&mut buf)).await.unwrap();
    buf.truncate(n);
    buf
}

/// A datagram on `socket` within `window`, if one comes (an error, such as an ICMP port
/// unreachable, is none).
pub(crate) async fn udp_recv_within(socket: &UdpSocket, window: Duration) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 65_536];
    let (n, _) = within(window, socket.recv_from(&mut buf)).await?.ok()?;
    buf.truncate(n);
    Some(buf)
}

/// Parses a reply and checks it answers `query` (same ID).
pub(crate) fn parse_reply(query: &[u8], reply: &[u8]) -> Message {
    let msg = Message::from_vec(reply).unwrap();
    assert_eq!(&reply[..2], &query[..2], "reply carries the client's ID");
    assert_eq!(msg.metadata.message_type, MessageType::Response);
    msg
}

/// UDP query → parsed reply.
pub(crate) async fn ask_udp(server: SocketAddr, name: &str, qtype: RecordType) -> Message {
    let q = query(name, qtype, Some((1232, false)));
    let r = udp_exchange(server, &q).await;
    parse_reply(&q, &r)
}

/// A TCP connection speaking RFC 1035 §4.2.2 framing.
pub(crate) struct TcpClient {
    pub(crate) stream: TcpStream,
}

impl TcpClient {
    pub(crate) async fn connect(server: SocketAddr) -> Self {
        let stream = patiently(TcpStream::connect(server)).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Self { stream }
    }

    /// Sends several framed messages in one write.
    pub(crate) async fn send_all(&mut self, messages: &[&[u8]]) {
        let mut out = Vec::new();
        for m in messages {
            out.extend_from_slice(&u16::try_from(m.len()).unwrap().to_be_bytes());
            out.extend_from_slice(m);
        }
        patiently(self.stream.write_all(&out)).await.unwrap();
    }

    /// The next framed message; `None` when the connection is closed (panics after
    /// [`PATIENCE`] without either).
    pub(crate) async fn recv(&mut self) -> Option<Vec<u8>> {
        patiently(Self::read_message(&mut self.stream)).await
    }

    /// The next framed message if it comes within `window`: `None` if nothing does,
    /// `Some(None)` if the connection is closed.
    pub(crate) async fn recv_within(&mut self, window: Duration) -> Option<Option<Vec<u8>>> {
        within(window, Self::read_message(&mut self.stream)).await
    }

    async fn read_message(stream: &mut TcpStream) -> Option<Vec<u8>> {
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.ok()?;
        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut msg).await.ok()?;
        Some(msg)
    }
}

/// IPv4 addresses of the A records in an answer.
pub(crate) fn ips(msg: &Message) -> HashSet<Ipv4Addr> {
    msg.answers
        .iter()
        .filter_map(|r| match r.data.ip_addr() {
            Some(IpAddr::V4(ip)) => Some(ip),
            _ => None,
        })
        .collect()
}

/// Real time a test waits at most for something that should happen. Generous: the suite runs
/// on machines busy with other work, and only a broken proxy gets anywhere near it.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// A real-time deadline `after` from now (test bookkeeping only: the proxy and the assertions
/// use tokio's clock).
#[allow(
    clippy::disallowed_types,
    reason = "a deadline on real time, whatever tokio's clock does"
)]
fn deadline(after: Duration) -> impl Fn() -> bool {
    let end = std::time::Instant::now() + after;
    move || std::time::Instant::now() >= end
}

/// Lets other tasks run before the condition is checked again: a yield on a current-thread
/// runtime (the paused-clock tests), where sleeping would let the paused clock auto-advance;
/// a short sleep otherwise.
async fn pause() {
    match Handle::current().runtime_flavor() {
        RuntimeFlavor::CurrentThread => tokio::task::yield_now().await,
        _ => tokio::time::sleep(Duration::from_millis(5)).await,
    }
}

/// Waits until `cond` holds (false after [`PATIENCE`]).
pub(crate) async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let expired = deadline(PATIENCE);
    loop {
        if cond() {
            return true;
        }
        if expired() {
            return cond();
        }
        pause().await;
    }
}

/// `fut`'s output if it completes within `window` of real time. On a current-thread runtime
/// the wait keeps the runtime busy (see the module's doc), so a paused clock stays where the
/// test put it.
pub(crate) async fn within<F: Future>(window: Duration, fut: F) -> Option<F::Output> {
    if Handle::current().runtime_flavor() != RuntimeFlavor::CurrentThread {
        return tokio::time::timeout(window, fut).await.ok();
    }
    let expired = deadline(window);
    let mut fut = pin!(fut);
    loop {
        let polled = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = polled {
            return Some(out);
        }
        if expired() {
            return None;
        }
        tokio::task::yield_now().await;
    }
}

/// `fut`'s output; panics if it does not complete within [`PATIENCE`].
pub(crate) async fn patiently<F: Future>(fut: F) -> F::Output {
    within(PATIENCE, fut)
        .await
        .expect("did not happen within PATIENCE")
}

/// On the paused clock: lets every task that can run do so, and the runtime take in what its
/// sockets and timers have for it, without time passing. Before asserting that something due
/// later has not happened yet.
pub(crate) async fn run_ready() {
    for _ in 0..256 {
        tokio::task::yield_now().await;
    }
}

/// On the paused clock: moves it by `by`, then lets what that made due run.
pub(crate) async fn advance(by: Duration) {
    tokio::time::advance(by).await;
    run_ready().await;
}
