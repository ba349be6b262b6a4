//! Socket-level redirects (node mode's cgroup socket programs): a query the policy says was
//! redirected to the proxy is about the destination the policy names — checked with the
//! sender it names, forwarded there, observed with it — while its reply leaves from the
//! address the query arrived at. Not privileged: the proxy listens on 127.0.0.1 as usual.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use std::sync::atomic::Ordering;

use fqdnd_dnsproxy::{
    Direction, QueryInfo, QueryPolicy, QueryResult, Redirect, Transport, Verdict,
};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use tokio::net::UdpSocket;

use crate::harness::{
    Harness, Mode, TcpClient, TestPolicy, eventually, ips, parse_reply, patiently, query,
    test_config,
};
use crate::upstream::{TestUpstream, answer};

/// A client at this address talks to the proxy directly (no redirect).
const DIRECT: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
/// The sender the policy names for redirected queries.
const SENDER: u64 = 9;

/// Every other client's query was redirected from `to`, by [`SENDER`].
struct Redirecting {
    to: SocketAddr,
    seen: Mutex<Vec<(SocketAddr, Option<u64>, Transport)>>,
}

impl QueryPolicy for Redirecting {
    fn check(&self, query: &QueryInfo<'_>) -> Verdict {
        self.seen
            .lock()
            .unwrap()
            .push((query.server, query.sender, query.transport));
        match query.sender {
            Some(sender) => Verdict::Allow { tag: sender },
            None => TestPolicy.check(query),
        }
    }

    fn redirected(
        &self,
        client: SocketAddr,
        _local: SocketAddr,
        _transport: Transport,
    ) -> Option<Redirect> {
        (client.ip() != DIRECT).then_some(Redirect {
            server: self.to,
            sender: SENDER,
        })
    }
}

async fn start() -> (Harness, Arc<Redirecting>) {
    let upstream = TestUpstream::start().await;
    let policy = Arc::new(Redirecting {
        to: upstream.addr,
        seen: Mutex::new(Vec::new()),
    });
    // No pool: only original destinations are forwarded to.
    let mut config = test_config(Vec::new());
    config.forward_to_original_destination = true;
    let h = Harness::with_policy(upstream, config, Mode::Done, policy.clone()).await;
    (h, policy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirected_query_goes_where_it_was_going_and_is_answered_from_where_it_came() {
    let (h, policy) = start().await;
    let ip = Ipv4Addr::new(192, 0, 2, 7);
    h.upstream
        .rule("www.example.", answer("www.example.", [ip]));

    // UDP: forwarded to the original destination, the reply from the proxy's own address.
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let q = query("www.example.", RecordType::A, Some((1232, false)));
    client.send_to(&q, h.udp).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, from) = patiently(client.recv_from(&mut buf)).await.unwrap();
    assert_eq!(from, h.udp, "the reply leaves from where the query arrived");
    assert_eq!(ips(&parse_reply(&q, &buf[..n])), [ip].into());

    // TCP the same.
    let mut tcp = TcpClient::connect(h.tcp).await;
    tcp.send_all(&[&q]).await;
    let reply = tcp.recv().await.unwrap();
    assert_eq!(ips(&parse_reply(&q, &reply)), [ip].into());

    // The policy saw the original destination and the sender; the observer got its tag and
    // the answer came from the original destination.
    let seen = policy.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            (h.upstream.addr, Some(SENDER), Transport::Udp),
            (h.upstream.addr, Some(SENDER), Transport::Tcp),
        ]
    );
    let observed = h.observer.seen_name("www.example.");
    assert_eq!(observed.len(), 2);
    assert!(
        observed
            .iter()
            .all(|o| o.tag == SENDER && o.upstream == h.upstream.addr)
    );
    assert_eq!(h.upstream.count("www.example.", false), 2);
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Answered), 2);
    assert_eq!(stats.original_destinations, 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_that_was_not_redirected_is_about_the_proxy_itself() {
    let (h, policy) = start().await;
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(192, 0, 2, 7)]),
    );
    let client = UdpSocket::bind((DIRECT, 0)).await.unwrap();
    let q = query("www.example.", RecordType::A, Some((1232, false)));
    client.send_to(&q, h.udp).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, from) = patiently(client.recv_from(&mut buf)).await.unwrap();
    assert_eq!(from, h.udp);
    // To the proxy itself, with no pool: refused, never forwarded.
    let msg = parse_reply(&q, &buf[..n]);
    assert_eq!(msg.metadata.response_code, ResponseCode::Refused);
    assert_eq!(
        policy.seen.lock().unwrap().clone(),
        vec![(h.udp, None, Transport::Udp)]
    );
    assert!(h.upstream.queries().is_empty());
    h.stop().await;
}

/// The recording says which messages were redirected at the socket level: their tag is the
/// sender the redirect named, not found by the client's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirected_query_is_recorded_as_named_by_its_socket() {
    let (h, _) = start().await;
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(192, 0, 2, 7)]),
    );
    h.recorder.on.store(true, Ordering::Relaxed);
    for from in [Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 3)] {
        let client = UdpSocket::bind((from, 0)).await.unwrap();
        let q = query("www.example.", RecordType::A, Some((1232, false)));
        client.send_to(&q, h.udp).await.unwrap();
        let mut buf = vec![0u8; 4096];
        patiently(client.recv_from(&mut buf)).await.unwrap();
    }
    let taken = || h.recorder.taken.lock().unwrap().clone();
    assert!(eventually(|| taken().len() == 4).await, "{:?}", taken());
    let seen: Vec<_> = taken()
        .iter()
        .map(|m| (m.direction, m.tag, m.redirected))
        .collect();
    assert_eq!(
        seen,
        [
            (Direction::Query, Some(SENDER), true),
            (Direction::Reply, Some(SENDER), true),
            // The direct client's query: its tag found by its address (then refused: it asked
            // the proxy itself, and there is no pool).
            (Direction::Query, Some(7), false),
            (Direction::Reply, Some(7), false),
        ]
    );
    h.stop().await;
}
