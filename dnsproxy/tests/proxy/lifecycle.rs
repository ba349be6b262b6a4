//! Binding (errors name the address, port 0 resolved, several sockets on one port) and
//! shutdown (listeners stop).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use fqdnd_dnsproxy::{DnsProxy, Error, Transport};
use hickory_proto::rr::RecordType;

use crate::harness::{
    Harness, Mode, TestObserver, TestPolicy, ask_udp, query, test_config, udp_client,
    udp_recv_within,
};
use crate::upstream::answer;

async fn bind(config: fqdnd_dnsproxy::Config) -> Result<DnsProxy, Error> {
    DnsProxy::bind(
        config,
        Arc::new(TestPolicy),
        TestObserver::new(Mode::Done),
        fqdnd_dnsproxy::Taps::default(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_errors_name_the_address() {
    let upstream: SocketAddr = "127.0.0.1:53".parse().unwrap();
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut config = test_config(vec![upstream]);
    config.listen_udp = vec![addr];
    let err = bind(config).await.unwrap_err();
    assert!(
        matches!(err, Error::Bind { transport: Transport::Udp, addr: a, .. } if a == addr),
        "{err:?}"
    );
    assert!(err.to_string().contains(&addr.to_string()), "{err}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut config = test_config(vec![upstream]);
    config.listen_tcp = vec![addr];
    let err = bind(config).await.unwrap_err();
    assert!(matches!(err, Error::Bind { transport: Transport::Tcp, addr: a, .. } if a == addr));

    let err = bind(test_config(vec![])).await.unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_zero_is_resolved_and_shared_by_every_socket() {
    let mut config = test_config(vec!["127.0.0.1:53".parse().unwrap()]);
    config.udp_sockets_per_address = 4;
    config.listen_udp = vec![
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    ];
    let proxy = bind(config).await.unwrap();
    let udp = proxy.udp_addrs();
    assert_eq!(udp.len(), 2, "one address per configured address: {udp:?}");
    assert!(udp.iter().all(|a| a.port() != 0));
    assert_ne!(udp[0].port(), udp[1].port());
    assert!(proxy.tcp_addrs()[0].port() != 0);
    assert_eq!(proxy.stats().upstreams.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_listeners() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(192, 0, 2, 1)]),
    );
    ask_udp(h.udp, "www.example.", RecordType::A).await;
    let (udp, tcp) = (h.udp, h.tcp);
    h.stop().await;
    // Nothing listens any more: no reply (over a short window: a loaded machine can only make
    // this pass).
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let q = query("www.example.", RecordType::A, None);
    client.send_to(&q, udp).await.unwrap();
    assert!(
        udp_recv_within(&client, Duration::from_millis(300))
            .await
            .is_none()
    );
    assert!(
        tokio::net::TcpStream::connect(tcp).await.is_err(),
        "TCP listener closed"
    );
}
