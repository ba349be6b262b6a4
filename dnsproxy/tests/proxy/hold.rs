//! The hold: no reply leaves before the observer has finished, or `response_max_delay` has
//! passed and the fallback applies.

use std::net::Ipv4Addr;
use std::time::Duration;

use fqdnd_dnsproxy::{HoldFallback, QueryResult};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use tokio::time::Instant;

use crate::harness::{
    Harness, Mode, TcpClient, eventually, ips, parse_reply, query, udp_client, udp_recv,
};
use crate::upstream::answer;

const IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_reaches_the_client_before_the_observer_returns() {
    let h = Harness::start(Mode::Gated, |c| {
        c.response_max_delay = Duration::from_secs(10)
    })
    .await;
    h.upstream
        .rule("held.example.", answer("held.example.", [IP]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let q = query("held.example.", RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    assert!(eventually(Duration::from_secs(2), || !h.observer.seen().is_empty()).await);
    assert!(
        udp_recv(&client, Duration::from_millis(400))
            .await
            .is_none(),
        "held while observing"
    );
    h.observer.release();
    let r = udp_recv(&client, Duration::from_secs(2))
        .await
        .expect("released once observed");
    assert_eq!(ips(&parse_reply(&q, &r)), [IP].into());
    assert_eq!(
        h.observer
            .finished
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert_eq!(h.settled().await.queries(QueryResult::Answered), 1);
    assert_eq!(h.settled().await.hold_timeouts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_tcp_replies_also_wait() {
    let h = Harness::start(Mode::Gated, |c| {
        c.response_max_delay = Duration::from_secs(10)
    })
    .await;
    h.upstream
        .rule("held.example.", answer("held.example.", [IP]));
    let mut client = TcpClient::connect(h.tcp).await;
    let q = query("held.example.", RecordType::A, None);
    client.send_all(&[&q]).await;
    assert!(client.recv(Duration::from_millis(400)).await.is_none());
    h.observer.release();
    let r = client.recv(Duration::from_secs(2)).await.unwrap();
    assert_eq!(ips(&parse_reply(&q, &r)), [IP].into());
}

async fn never_finishing(
    fallback: HoldFallback,
) -> (Harness, Duration, hickory_proto::op::Message) {
    let h = Harness::start(Mode::Never, |c| {
        c.response_max_delay = Duration::from_millis(200);
        c.on_hold_timeout = fallback;
    })
    .await;
    h.upstream
        .rule("held.example.", answer("held.example.", [IP]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let q = query("held.example.", RecordType::A, None);
    let start = Instant::now();
    client.send_to(&q, h.udp).await.unwrap();
    let r = udp_recv(&client, Duration::from_secs(3)).await.unwrap();
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(waited < Duration::from_millis(1000), "{waited:?}");
    let msg = parse_reply(&q, &r);
    assert_eq!(h.settled().await.hold_timeouts, 1);
    (h, waited, msg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_max_delay_release_sends_the_answer() {
    let (h, _, msg) = never_finishing(HoldFallback::Release).await;
    assert_eq!(ips(&msg), [IP].into());
    assert_eq!(h.settled().await.queries(QueryResult::Answered), 1);
    let log = h.log.entries.lock().unwrap().clone();
    assert!(log[0].hold_us >= 200_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_max_delay_servfail_sends_servfail() {
    let (h, _, msg) = never_finishing(HoldFallback::ServFail).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    assert!(msg.answers.is_empty());
    assert_eq!(h.settled().await.queries(QueryResult::HoldTimeout), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_error_gets_the_fallback() {
    for (fallback, rcode, result) in [
        (
            HoldFallback::ServFail,
            ResponseCode::ServFail,
            QueryResult::ObserverFailed,
        ),
        (
            HoldFallback::Release,
            ResponseCode::NoError,
            QueryResult::Answered,
        ),
    ] {
        let h = Harness::start(Mode::Fail, |c| c.on_hold_timeout = fallback).await;
        h.upstream
            .rule("held.example.", answer("held.example.", [IP]));
        let q = query("held.example.", RecordType::A, None);
        let r = crate::harness::udp_exchange(h.udp, &q, Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(parse_reply(&q, &r).metadata.response_code, rcode);
        let stats = h.settled().await;
        assert_eq!(stats.observer_errors, 1);
        assert_eq!(stats.queries(result), 1);
    }
}
