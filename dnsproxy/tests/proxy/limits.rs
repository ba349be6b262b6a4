//! The concurrency limit and the TCP connection limit.

use std::net::Ipv4Addr;
use std::time::Duration;

use fqdnd_dnsproxy::QueryResult;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use tokio::time::Instant;

use crate::harness::{Harness, Mode, TcpClient, ask_udp, eventually, ips, parse_reply, query};
use crate::upstream::{Rule, answer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_concurrency_limit_servfail_at_once() {
    let h = Harness::start(Mode::Done, |c| c.concurrency_limit = 2).await;
    h.upstream.rule(
        "slow.example.",
        Rule {
            delay: Duration::from_millis(300),
            ..answer("slow.example.", [Ipv4Addr::new(192, 0, 2, 1)])
        },
    );
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let server = h.udp;
        tasks.push(tokio::spawn(async move {
            ask_udp(server, "slow.example.", RecordType::A).await
        }));
    }
    assert!(eventually(Duration::from_secs(2), || h.stats().inflight == 2).await);
    for _ in 0..3 {
        let start = Instant::now();
        let msg = ask_udp(h.udp, "slow.example.", RecordType::A).await;
        assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
        assert!(
            start.elapsed() < Duration::from_millis(250),
            "not after the 300 ms upstream"
        );
    }
    for t in tasks {
        assert_eq!(ips(&t.await.unwrap()).len(), 1);
    }
    let stats = h.settled().await;
    assert_eq!(stats.concurrency_limited, 3);
    assert_eq!(stats.queries(QueryResult::ConcurrencyLimited), 3);
    assert_eq!(stats.queries(QueryResult::Answered), 2);
    assert_eq!(stats.inflight, 0);
    assert_eq!(h.upstream.count("slow.example.", false), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_closed() {
    let h = Harness::start(Mode::Done, |c| c.max_tcp_connections = 1).await;
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(192, 0, 2, 1)]),
    );
    let mut first = TcpClient::connect(h.tcp).await;
    let q = query("www.example.", RecordType::A, None);
    first.send_all(&[&q]).await;
    assert!(first.recv(Duration::from_secs(2)).await.is_some());
    let mut second = TcpClient::connect(h.tcp).await;
    second.send_all(&[&q]).await;
    assert!(
        second.recv(Duration::from_secs(2)).await.is_none(),
        "closed"
    );
    assert_eq!(h.settled().await.tcp_refused, 1);
    assert_eq!(h.settled().await.tcp_connections, 1);
    drop(first);
    assert!(eventually(Duration::from_secs(2), || h.stats().tcp_connections == 0).await);
    let mut third = TcpClient::connect(h.tcp).await;
    third.send_all(&[&q]).await;
    let r = third.recv(Duration::from_secs(2)).await.unwrap();
    assert_eq!(ips(&parse_reply(&q, &r)).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_rate_is_dropped_or_refused() {
    use crate::harness::udp_exchange;
    use fqdnd_dnsproxy::RateLimitAction;

    for action in [RateLimitAction::Drop, RateLimitAction::Refused] {
        let h = Harness::start(Mode::Done, |c| {
            c.rate_limit_qps = 1;
            c.rate_limit_burst = 3;
            c.rate_limit_action = action;
        })
        .await;
        h.upstream.rule(
            "www.example.",
            answer("www.example.", [Ipv4Addr::new(192, 0, 2, 1)]),
        );
        let mut answered = 0;
        let mut refused = 0;
        let mut silent = 0;
        for _ in 0..10 {
            let q = query("www.example.", RecordType::A, None);
            match udp_exchange(h.udp, &q, Duration::from_millis(300)).await {
                Some(reply) => match parse_reply(&q, &reply).metadata.response_code {
                    ResponseCode::NoError => answered += 1,
                    ResponseCode::Refused => refused += 1,
                    other => panic!("unexpected {other:?}"),
                },
                None => silent += 1,
            }
        }
        // A burst of 3, plus at most one token refilled during the ~3 s of silent waits.
        assert!(
            (3..=5).contains(&answered),
            "{action:?}: {answered} answered"
        );
        match action {
            RateLimitAction::Drop => assert_eq!((refused, silent), (0, 10 - answered)),
            RateLimitAction::Refused => assert_eq!((refused, silent), (10 - answered, 0)),
        }
        let stats = h.settled().await;
        assert_eq!(
            stats.queries(QueryResult::RateLimited),
            10 - answered as u64
        );
        assert_eq!(h.upstream.count("www.example.", false), answered);
    }
}
