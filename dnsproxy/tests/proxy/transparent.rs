//! Transparent mode on loopback, without a BPF redirect: the listeners are bound to a wildcard
//! address and clients send to other local addresses of the same port (all of 127/8 is
//! local), so each query's original destination differs from the listener's bound address
//! and the reply must come from that destination, through the raw socket. Needs root
//! (IP_TRANSPARENT, raw sockets): skipped otherwise, unless `FQDND_REQUIRE_PRIVILEGED=1`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use fqdnd_dnsproxy::{
    Config, DnsProxy, Error, QueryInfo, QueryPolicy, QueryResult, Transport, Verdict,
};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use tokio::net::UdpSocket;

use crate::harness::{
    Harness, Mode, TcpClient, TestObserver, TestPolicy, ips, parse_reply, patiently, query,
    test_config,
};
use crate::upstream::{Rule, TestUpstream, answer};

/// Whether the test may run: root runs it; otherwise it is skipped with a message, unless
/// `FQDND_REQUIRE_PRIVILEGED=1`, which makes the skip a failure.
fn privileged(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
        "{test} needs root (IP_TRANSPARENT, raw sockets) and FQDND_REQUIRE_PRIVILEGED=1"
    );
    eprintln!("skipping {test}: needs root (IP_TRANSPARENT, raw sockets)");
    false
}

/// [`TestPolicy`], recording the server and transport of every query it is shown.
#[derive(Default)]
struct RecordingPolicy {
    seen: Mutex<Vec<(String, SocketAddr, Transport)>>,
}

impl RecordingPolicy {
    fn server_of(&self, name: &str) -> Vec<(SocketAddr, Transport)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, s, t)| (*s, *t))
            .collect()
    }
}

impl QueryPolicy for RecordingPolicy {
    fn check(&self, query: &QueryInfo<'_>) -> Verdict {
        self.seen
            .lock()
            .unwrap()
            .push((query.name.to_owned(), query.server, query.transport));
        TestPolicy.check(query)
    }
}

/// A transparent proxy listening on `ip` (a wildcard or not), port 0, in front of a
/// [`TestUpstream`].
async fn start(ip: IpAddr, tweak: impl FnOnce(&mut Config)) -> (Harness, Arc<RecordingPolicy>) {
    let upstream = TestUpstream::start().await;
    let mut config = test_config(vec![upstream.addr]);
    config.listen_udp = vec![SocketAddr::new(ip, 0)];
    config.listen_tcp = vec![SocketAddr::new(ip, 0)];
    config.transparent = true;
    tweak(&mut config);
    let policy = Arc::new(RecordingPolicy::default());
    let h = Harness::with_policy(upstream, config, Mode::Done, policy.clone()).await;
    (h, policy)
}

/// Sends `name` from an unconnected socket on `client_ip` to `server`; returns the reply and
/// the address it came from.
async fn ask_from(client_ip: IpAddr, server: SocketAddr, name: &str) -> (Message, SocketAddr) {
    let client = UdpSocket::bind(SocketAddr::new(client_ip, 0))
        .await
        .unwrap();
    let q = query(name, RecordType::A, Some((1232, false)));
    client.send_to(&q, server).await.unwrap();
    let mut buf = vec![0u8; 65_536];
    let (n, from) = patiently(client.recv_from(&mut buf)).await.unwrap();
    (parse_reply(&q, &buf[..n]), from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_replies_come_from_the_original_destination() {
    if !privileged("udp_replies_come_from_the_original_destination") {
        return;
    }
    let (h, policy) = start(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |_| {}).await;
    let port = h.udp.port();
    let ip = Ipv4Addr::new(192, 0, 2, 1);
    h.upstream
        .rule("www.example.", answer("www.example.", [ip]));
    h.upstream.rule(
        "silent.example.",
        Rule {
            silent: true,
            ..Rule::default()
        },
    );
    let client = IpAddr::V4(Ipv4Addr::LOCALHOST);

    // An answer.
    let to = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 2), port));
    let (msg, from) = ask_from(client, to, "www.example.").await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError);
    assert_eq!(ips(&msg), [ip].into());
    assert_eq!(
        from, to,
        "the answer comes from the address the query was sent to"
    );
    assert_eq!(
        policy.server_of("www.example."),
        [(to, Transport::Udp)],
        "the policy sees the original destination"
    );

    // REFUSED, written by the proxy itself.
    let to = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 3), port));
    let (msg, from) = ask_from(client, to, "denied.example.").await;
    assert_eq!(msg.metadata.response_code, ResponseCode::Refused);
    assert_eq!(from, to);
    assert_eq!(policy.server_of("denied.example."), [(to, Transport::Udp)]);

    // SERVFAIL after the upstream timeout.
    let to = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 4), port));
    let (msg, from) = ask_from(client, to, "silent.example.").await;
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(from, to);

    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Answered), 1);
    assert_eq!(stats.queries(QueryResult::Denied), 1);
    assert_eq!(stats.queries(QueryResult::UpstreamTimeout), 1);
    assert_eq!(
        stats.raw_replies, 3,
        "every reply left through the raw socket"
    );
    assert_eq!(stats.raw_reply_errors, 0);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_server_is_the_accepted_local_address() {
    if !privileged("tcp_server_is_the_accepted_local_address") {
        return;
    }
    let (h, policy) = start(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |_| {}).await;
    let ip = Ipv4Addr::new(192, 0, 2, 7);
    h.upstream
        .rule("www.example.", answer("www.example.", [ip]));
    let to = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 5), h.tcp.port()));
    let mut client = TcpClient::connect(to).await;
    assert_eq!(client.stream.peer_addr().unwrap(), to);
    let q = query("www.example.", RecordType::A, None);
    client.send_all(&[&q]).await;
    let r = client.recv().await.expect("a reply");
    assert_eq!(ips(&parse_reply(&q, &r)), [ip].into());
    assert_eq!(policy.server_of("www.example."), [(to, Transport::Tcp)]);
    assert_eq!(h.settled().await.raw_replies, 0, "TCP needs no raw socket");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_end_to_end() {
    if !privileged("ipv6_end_to_end") {
        return;
    }
    let (h, policy) = start(IpAddr::V6(Ipv6Addr::UNSPECIFIED), |_| {}).await;
    let ip = Ipv4Addr::new(192, 0, 2, 9);
    h.upstream
        .rule("www.example.", answer("www.example.", [ip]));
    let client = IpAddr::V6(Ipv6Addr::LOCALHOST);

    // UDP to [::1]:P reaches the wildcard listener [::]:P: the reply must come from [::1]:P.
    let to = SocketAddr::from((Ipv6Addr::LOCALHOST, h.udp.port()));
    let (msg, from) = ask_from(client, to, "www.example.").await;
    assert_eq!(ips(&msg), [ip].into());
    assert_eq!(from, to);
    let (msg, from) = ask_from(client, to, "denied.example.").await;
    assert_eq!(msg.metadata.response_code, ResponseCode::Refused);
    assert_eq!(from, to);

    // TCP.
    let tcp_to = SocketAddr::from((Ipv6Addr::LOCALHOST, h.tcp.port()));
    let mut tcp = TcpClient::connect(tcp_to).await;
    let q = query("www.example.", RecordType::A, None);
    tcp.send_all(&[&q]).await;
    let r = tcp.recv().await.expect("a reply");
    assert_eq!(ips(&parse_reply(&q, &r)), [ip].into());

    assert_eq!(
        policy.server_of("www.example."),
        [(to, Transport::Udp), (tcp_to, Transport::Tcp)]
    );
    let stats = h.settled().await;
    assert_eq!(stats.raw_replies, 2);
    assert_eq!(stats.raw_reply_errors, 0);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_specific_listen_address_replies_from_its_own_socket() {
    if !privileged("a_specific_listen_address_replies_from_its_own_socket") {
        return;
    }
    let (h, policy) = start(IpAddr::V4(Ipv4Addr::LOCALHOST), |_| {}).await;
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(192, 0, 2, 1)]),
    );
    let (msg, from) = ask_from(IpAddr::V4(Ipv4Addr::LOCALHOST), h.udp, "www.example.").await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError);
    assert_eq!(from, h.udp);
    assert_eq!(policy.server_of("www.example."), [(h.udp, Transport::Udp)]);
    assert_eq!(
        h.settled().await.raw_replies,
        0,
        "the original destination is the listener's own address: a normal send"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_to_the_proxy_itself_with_no_pool_is_refused() {
    if !privileged("a_query_to_the_proxy_itself_with_no_pool_is_refused") {
        return;
    }
    let (h, _) = start(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| {
        c.upstreams.clear();
        c.forward_to_original_destination = true;
    })
    .await;
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(192, 0, 2, 1)]),
    );
    // The wildcard listener owns its port on every address: never forwarded to ourselves.
    for last in [1, 2] {
        let to = SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), h.udp.port()));
        let (msg, from) = ask_from(IpAddr::V4(Ipv4Addr::LOCALHOST), to, "www.example.").await;
        assert_eq!(msg.metadata.response_code, ResponseCode::Refused);
        assert_eq!(from, to);
    }
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::NoUpstream), 2);
    assert_eq!(stats.original_destinations, 0, "no upstream opened");
    assert_eq!(stats.original_destination_overflow, 0);
    assert!(h.upstream.queries().is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_to_the_proxy_itself_uses_the_pool() {
    if !privileged("a_query_to_the_proxy_itself_uses_the_pool") {
        return;
    }
    let (h, _) = start(IpAddr::V4(Ipv4Addr::LOCALHOST), |c| {
        c.forward_to_original_destination = true;
    })
    .await;
    let ip = Ipv4Addr::new(192, 0, 2, 1);
    h.upstream
        .rule("www.example.", answer("www.example.", [ip]));
    let (msg, from) = ask_from(IpAddr::V4(Ipv4Addr::LOCALHOST), h.udp, "www.example.").await;
    assert_eq!(ips(&msg), [ip].into());
    assert_eq!(from, h.udp);
    assert_eq!(h.upstream.count("www.example.", false), 1);
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Answered), 1);
    assert_eq!(stats.original_destinations, 0);
    h.stop().await;
}

/// Not privileged: the errors a process without the capabilities gets (only checked when not
/// root; as root there is nothing to check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_privileges_the_missing_capability_is_named() {
    if nix::unistd::geteuid().is_root() {
        eprintln!("without_privileges_the_missing_capability_is_named: checked only when not root");
        return;
    }
    let mut config = test_config(vec!["127.0.0.1:53".parse().unwrap()]);
    config.transparent = true;
    let err = DnsProxy::bind(
        config,
        Arc::new(TestPolicy),
        TestObserver::new(Mode::Done),
        fqdnd_dnsproxy::Taps::default(),
    )
    .await
    .unwrap_err();
    let Error::MissingCapability {
        addr, capability, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*addr, "127.0.0.1:0".parse::<SocketAddr>().unwrap());
    assert!(capability.contains("CAP_NET_RAW"), "{err}");
    assert!(err.to_string().contains("IP_TRANSPARENT"), "{err}");
}
