//! The concurrency limit and the TCP connection limit.

use std::net::Ipv4Addr;
use std::time::Duration;

use fqdnd_dnsproxy::QueryResult;
use fqdnd_dnsproxy::RateLimitAction;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::harness::{
    Harness, Mode, TcpClient, advance, ask_udp, eventually, ips, parse_reply, patiently, query,
    udp_client, udp_recv, udp_recv_within,
};
use crate::upstream::{Rule, answer};

/// On the paused clock: the slow answers come only when the test moves the clock, so the two
/// slow queries are in flight while the others are refused, and those refusals cannot wait for
/// anything.
#[tokio::test(start_paused = true)]
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
    assert!(eventually(|| h.stats().inflight == 2).await);
    for _ in 0..3 {
        let msg = ask_udp(h.udp, "slow.example.", RecordType::A).await;
        assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    }
    assert_eq!(h.stats().inflight, 2, "the slow ones are still in flight");
    advance(Duration::from_millis(300)).await;
    for t in tasks {
        assert_eq!(ips(&patiently(t).await.unwrap()).len(), 1);
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
    assert!(first.recv().await.is_some());
    let mut second = TcpClient::connect(h.tcp).await;
    second.send_all(&[&q]).await;
    assert!(second.recv().await.is_none(), "closed");
    assert_eq!(h.settled().await.tcp_refused, 1);
    assert_eq!(h.settled().await.tcp_connections, 1);
    drop(first);
    assert!(eventually(|| h.stats().tcp_connections == 0).await);
    let mut third = TcpClient::connect(h.tcp).await;
    third.send_all(&[&q]).await;
    let r = third.recv().await.unwrap();
    assert_eq!(ips(&parse_reply(&q, &r)).len(), 1);
}

/// On the paused clock no token is refilled unless the test moves it: exactly the burst is
/// answered, then one more query once a second has passed.
#[tokio::test(start_paused = true)]
async fn a_client_over_its_rate_is_dropped_or_refused() {
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
        // One socket: its datagrams reach one listener socket and are handled in order.
        let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
        let queries: Vec<Vec<u8>> = (0..10)
            .map(|_| query("www.example.", RecordType::A, None))
            .collect();
        for q in &queries {
            client.send_to(q, h.udp).await.unwrap();
        }
        // Every reply has left once all ten are counted.
        assert!(
            eventually(|| {
                let s = h.stats();
                s.queries(QueryResult::Answered) + s.queries(QueryResult::RateLimited) == 10
            })
            .await
        );
        let stats = h.settled().await;
        assert_eq!(stats.queries(QueryResult::Answered), 3, "{action:?}");
        assert_eq!(stats.queries(QueryResult::RateLimited), 7, "{action:?}");
        assert_eq!(h.upstream.count("www.example.", false), 3);
        let replies = match action {
            RateLimitAction::Drop => 3,
            RateLimitAction::Refused => 10,
        };
        for _ in 0..replies {
            let r = udp_recv(&client).await;
            let i = queries.iter().position(|q| q[..2] == r[..2]).unwrap();
            let code = parse_reply(&queries[i], &r).metadata.response_code;
            // The first three are the burst.
            let expected = if i < 3 {
                ResponseCode::NoError
            } else {
                ResponseCode::Refused
            };
            assert_eq!(code, expected, "{action:?}: query {i}");
        }
        assert!(
            udp_recv_within(&client, Duration::from_millis(100))
                .await
                .is_none(),
            "{action:?}: nothing more"
        );
        // A second later one token is back.
        advance(Duration::from_secs(1)).await;
        let q = query("www.example.", RecordType::A, None);
        client.send_to(&q, h.udp).await.unwrap();
        let r = udp_recv(&client).await;
        assert_eq!(
            parse_reply(&q, &r).metadata.response_code,
            ResponseCode::NoError,
            "{action:?}"
        );
    }
}
