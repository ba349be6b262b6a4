//! TCP clients: pipelined queries answered as they finish, idle connections closed, policy
//! and errors as over UDP.

use std::net::Ipv4Addr;
use std::time::Duration;

use fqdnd_dnsproxy::Transport;
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use tokio::io::AsyncReadExt;

use crate::harness::{Harness, Mode, TcpClient, advance, eventually, ips, patiently, query};
use crate::upstream::{Rule, answer};

/// On the paused clock the upstream answers each name after its delay, and only when the test
/// moves the clock there: the replies come in the order the answers do.
#[tokio::test(start_paused = true)]
async fn pipelined_queries_are_answered_as_they_finish() {
    let h = Harness::start(Mode::Done, |c| c.upstream_timeout = Duration::from_secs(2)).await;
    let delays = [
        ("slow.example.", 400u64, 1u8),
        ("fast.example.", 0, 2),
        ("mid.example.", 150, 3),
    ];
    for (name, ms, last) in delays {
        let rule = answer(name, [Ipv4Addr::new(192, 0, 2, last)]);
        h.upstream.rule(
            name,
            Rule {
                delay: Duration::from_millis(ms),
                ..rule
            },
        );
    }
    let queries: Vec<Vec<u8>> = delays
        .iter()
        .map(|(n, _, _)| query(n, RecordType::A, None))
        .collect();
    let denied = query("denied.example.", RecordType::A, None);
    let mut client = TcpClient::connect(h.tcp).await;
    let refs: Vec<&[u8]> = queries
        .iter()
        .map(Vec::as_slice)
        .chain([denied.as_slice()])
        .collect();
    client.send_all(&refs).await;
    let mut order = Vec::new();
    let next = async |client: &mut TcpClient| {
        let r = client.recv().await.unwrap();
        let msg = Message::from_vec(&r).unwrap();
        let name = msg.queries[0].name.to_ascii();
        if name == "denied.example." {
            assert_eq!(msg.metadata.response_code, ResponseCode::Refused);
        } else {
            let i = queries.iter().position(|q| q[..2] == r[..2]).unwrap();
            assert_eq!(ips(&msg), [Ipv4Addr::new(192, 0, 2, delays[i].2)].into());
        }
        name
    };
    // The denied one is answered by the proxy as it reads it, the fast one as soon as the
    // upstream answers.
    order.push(next(&mut client).await);
    order.push(next(&mut client).await);
    advance(Duration::from_millis(150)).await;
    order.push(next(&mut client).await);
    advance(Duration::from_millis(250)).await;
    order.push(next(&mut client).await);
    assert_eq!(
        order,
        [
            "denied.example.",
            "fast.example.",
            "mid.example.",
            "slow.example."
        ]
    );
    assert!(
        h.observer
            .seen()
            .iter()
            .all(|o| o.transport == Transport::Tcp)
    );
}

#[tokio::test(start_paused = true)]
async fn idle_connection_is_closed() {
    let h = Harness::start(Mode::Done, |c| {
        c.tcp_idle_timeout = Duration::from_millis(200)
    })
    .await;
    let mut client = TcpClient::connect(h.tcp).await;
    // Its idle timer starts when the proxy takes the connection in, at this instant of the
    // paused clock.
    assert!(eventually(|| h.stats().tcp_connections == 1).await);
    advance(Duration::from_millis(199)).await;
    assert_eq!(h.stats().tcp_connections, 1, "open at 199 ms");
    advance(Duration::from_millis(1)).await;
    assert!(eventually(|| h.stats().tcp_connections == 0).await);
    let mut byte = [0u8; 1];
    let n = patiently(client.stream.read(&mut byte)).await.unwrap();
    assert_eq!(n, 0, "EOF");
}

#[tokio::test(start_paused = true)]
async fn a_slow_answer_keeps_the_connection_open_past_the_idle_timeout() {
    let h = Harness::start(Mode::Done, |c| {
        c.tcp_idle_timeout = Duration::from_millis(150);
        c.upstream_timeout = Duration::from_secs(2);
    })
    .await;
    let rule = answer("slow.example.", [Ipv4Addr::new(192, 0, 2, 1)]);
    h.upstream.rule(
        "slow.example.",
        Rule {
            delay: Duration::from_millis(400),
            ..rule
        },
    );
    let mut client = TcpClient::connect(h.tcp).await;
    let q = query("slow.example.", RecordType::A, None);
    client.send_all(&[&q]).await;
    assert!(eventually(|| h.upstream.count("slow.example.", false) == 1).await);
    // Two idle timeouts pass while the answer is awaited.
    for _ in 0..8 {
        advance(Duration::from_millis(50)).await;
    }
    let r = client.recv().await.expect("answered, not closed");
    assert_eq!(&r[..2], &q[..2]);
    assert_eq!(h.stats().tcp_connections, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_query_over_tcp_gets_formerr() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    let mut client = TcpClient::connect(h.tcp).await;
    let bad = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0x3f];
    client.send_all(&[&bad]).await;
    let r = client.recv().await.unwrap();
    assert_eq!((&r[..2], r[3] & 0x0f), (&[0x12, 0x34][..], 1));
    // The connection stays usable.
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(192, 0, 2, 1)]),
    );
    let q = query("www.example.", RecordType::A, None);
    client.send_all(&[&q]).await;
    let r = client.recv().await.unwrap();
    assert_eq!(&r[..2], &q[..2]);
}
