//! The hold: no reply leaves before the observer has finished, or `response_max_delay` has
//! passed and the fallback applies.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::harness::{
    Harness, Mode, TcpClient, advance, eventually, ips, parse_reply, query, run_ready, udp_client,
    udp_recv, udp_recv_within,
};
use crate::upstream::answer;
use fqdnd_dnsproxy::{HoldFallback, QueryResult};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

const IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

/// On the paused clock the hold cannot time out: whatever reaches the client before the
/// observer returns was released early.
#[tokio::test(start_paused = true)]
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
    assert!(eventually(|| !h.observer.seen().is_empty()).await);
    run_ready().await;
    // A release would have been counted right after the reply left.
    assert_eq!(h.stats().queries(QueryResult::Answered), 0, "held");
    assert!(
        udp_recv_within(&client, Duration::from_millis(200))
            .await
            .is_none(),
        "held while observing"
    );
    h.observer.release();
    let r = udp_recv(&client).await;
    assert_eq!(ips(&parse_reply(&q, &r)), [IP].into());
    assert_eq!(
        h.observer
            .finished
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Answered), 1);
    assert_eq!(stats.hold_timeouts, 0);
}

#[tokio::test(start_paused = true)]
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
    assert!(eventually(|| !h.observer.seen().is_empty()).await);
    run_ready().await;
    assert_eq!(h.stats().queries(QueryResult::Answered), 0, "held");
    assert!(
        client
            .recv_within(Duration::from_millis(200))
            .await
            .is_none(),
        "held while observing"
    );
    h.observer.release();
    let r = client.recv().await.unwrap();
    assert_eq!(ips(&parse_reply(&q, &r)), [IP].into());
}

/// A query whose observation never finishes, with `fallback`, on the paused clock: nothing
/// 1 ms before `response_max_delay` (200 ms) after the answer came, the fallback at 200 ms
/// exactly. Checks the warning names the action taken.
async fn never_finishing(fallback: HoldFallback) -> (Harness, hickory_proto::op::Message) {
    crate::logs::capture();
    let (name, action) = match fallback {
        HoldFallback::Release => ("never-release.example.", "released anyway"),
        HoldFallback::ServFail => ("never-servfail.example.", "SERVFAIL"),
    };
    let h = Harness::start(Mode::Never, |c| {
        c.response_max_delay = Duration::from_millis(200);
        c.on_hold_timeout = fallback;
    })
    .await;
    h.upstream.rule(name, answer(name, [IP]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let q = query(name, RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    // The answer is in and shown to the observer at this instant of the paused clock.
    assert!(eventually(|| !h.observer.seen().is_empty()).await);
    advance(Duration::from_millis(199)).await;
    // The fallback is counted before its reply leaves.
    assert_eq!(h.stats().hold_timeouts, 0, "still held at 199 ms");
    advance(Duration::from_millis(1)).await;
    let r = udp_recv(&client).await;
    let msg = parse_reply(&q, &r);
    let stats = h.settled().await;
    assert_eq!(stats.hold_timeouts, 1);
    let log = h.log.entries.lock().unwrap().clone();
    assert_eq!(log[0].hold_us, 200_000, "held exactly response_max_delay");
    let warnings = crate::logs::warnings(name);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("did not finish in time") && warnings[0].contains(action),
        "{warnings:?}"
    );
    (h, msg)
}

#[tokio::test(start_paused = true)]
async fn after_the_max_delay_release_sends_the_answer() {
    let (h, msg) = never_finishing(HoldFallback::Release).await;
    assert_eq!(ips(&msg), [IP].into());
    // Released, yet counted as what it is: a hold timeout.
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::HoldTimeout), 1);
    assert_eq!(stats.queries(QueryResult::Answered), 0);
    let log = h.log.entries.lock().unwrap().clone();
    assert_eq!(
        (log[0].result, log[0].rcode.as_str(), log[0].answers),
        (QueryResult::HoldTimeout, "NOERROR", 1)
    );
}

#[tokio::test(start_paused = true)]
async fn after_the_max_delay_servfail_sends_servfail() {
    let (h, msg) = never_finishing(HoldFallback::ServFail).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    assert!(msg.answers.is_empty());
    assert_eq!(h.settled().await.queries(QueryResult::HoldTimeout), 1);
}

/// Regression: with `release` an observer failure was counted as `answered`, although the
/// answer was released unobserved; it is `observer_failed` whatever the fallback, and the
/// warning says what the proxy did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_error_gets_the_fallback_and_is_counted_in_both_modes() {
    crate::logs::capture();
    for (fallback, name, rcode, action) in [
        (
            HoldFallback::ServFail,
            "observer-fails-servfail.example.",
            ResponseCode::ServFail,
            "SERVFAIL",
        ),
        (
            HoldFallback::Release,
            "observer-fails-release.example.",
            ResponseCode::NoError,
            "released anyway",
        ),
    ] {
        let h = Harness::start(Mode::Fail, |c| c.on_hold_timeout = fallback).await;
        h.upstream.rule(name, answer(name, [IP]));
        let q = query(name, RecordType::A, None);
        let r = crate::harness::udp_exchange(h.udp, &q).await;
        let msg = parse_reply(&q, &r);
        assert_eq!(msg.metadata.response_code, rcode, "{fallback:?}");
        let stats = h.settled().await;
        assert_eq!(stats.observer_errors, 1, "{fallback:?}");
        assert_eq!(
            stats.queries(QueryResult::ObserverFailed),
            1,
            "{fallback:?}"
        );
        assert_eq!(stats.queries(QueryResult::Answered), 0, "{fallback:?}");
        let log = h.log.entries.lock().unwrap().clone();
        assert_eq!(log[0].result, QueryResult::ObserverFailed);
        let warnings = crate::logs::warnings(name);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("DNS observer failed")
                && warnings[0].contains("test failure")
                && warnings[0].contains(action),
            "{fallback:?}: {warnings:?}"
        );
    }
}
