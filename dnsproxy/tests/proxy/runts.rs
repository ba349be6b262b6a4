//! Messages shorter than a DNS header (12 bytes) are dropped unanswered and counted: an answer
//! to one would be bigger than it (a 2-byte datagram used to get a 12-byte FORMERR), a
//! reflection amplifier towards a spoofed source. Over TCP the connection is closed, as BIND
//! does.

use std::net::Ipv4Addr;
use std::time::Duration;

use fqdnd_dnsproxy::QueryResult;
use hickory_proto::rr::RecordType;
use tokio::io::AsyncReadExt;

use crate::harness::{
    Harness, Mode, TcpClient, ips, parse_reply, patiently, query, udp_client, udp_recv,
};
use crate::upstream::answer;

const REAL: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

/// A runt of `n` bytes that would get a FORMERR if it were treated as a query: a client ID
/// (0xabcd), QR=0 and RD=1 as far as the bytes go.
fn runt(n: usize) -> Vec<u8> {
    [0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0][..n].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_runts_get_no_reply_and_are_counted() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream
        .rule("www.example.", answer("www.example.", [REAL]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    for n in 0..12 {
        client.send_to(&runt(n), h.udp).await.unwrap();
    }
    // From one client socket every datagram reaches the same listener socket (SO_REUSEPORT
    // hashes the 4-tuple), which handles them in order: a reply to any runt would be sent
    // before this query is even read, so the first datagram back must be its answer.
    let q = query("www.example.", RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    let r = udp_recv(&client).await;
    assert_eq!(
        ips(&parse_reply(&q, &r)),
        [REAL].into(),
        "not a reply to a runt"
    );
    let mut buf = [0u8; 512];
    assert!(
        client.try_recv(&mut buf).is_err(),
        "nothing else was sent to the client"
    );
    let stats = h.settled().await;
    assert_eq!(stats.runt_queries, 12);
    assert_eq!(
        stats.queries(QueryResult::Malformed),
        0,
        "runts are no queries"
    );
    assert_eq!(stats.queries(QueryResult::Answered), 1);
    assert_eq!(
        h.upstream.queries().len(),
        1,
        "nothing forwarded but the query"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_runt_closes_the_connection_after_the_queries_before_it() {
    // A long idle timeout: the connection can only close because of the runt.
    let h = Harness::start(Mode::Done, |c| {
        c.tcp_idle_timeout = Duration::from_secs(600)
    })
    .await;
    h.upstream
        .rule("www.example.", answer("www.example.", [REAL]));
    for n in [2, 11] {
        let mut client = TcpClient::connect(h.tcp).await;
        let q = query("www.example.", RecordType::A, None);
        client.send_all(&[&q, &runt(n)]).await;
        let r = client
            .recv()
            .await
            .expect("the query before the runt is answered");
        assert_eq!(ips(&parse_reply(&q, &r)), [REAL].into());
        let mut rest = Vec::new();
        // Closed, not left open (where the read would wait until PATIENCE runs out).
        let read = patiently(client.stream.read_to_end(&mut rest)).await;
        assert!(
            read.is_ok() && rest.is_empty(),
            "no reply to the runt: {rest:?}"
        );
    }
    assert_eq!(h.stats().runt_queries, 2);

    // Other connections are served.
    let mut client = TcpClient::connect(h.tcp).await;
    let q = query("www.example.", RecordType::A, None);
    client.send_all(&[&q]).await;
    let r = client.recv().await.expect("answered");
    assert_eq!(ips(&parse_reply(&q, &r)), [REAL].into());
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Answered), 3);
    assert_eq!(stats.queries(QueryResult::Malformed), 0);
    h.stop().await;
}
