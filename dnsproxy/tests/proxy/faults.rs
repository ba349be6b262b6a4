//! A hostile or failing upstream: spoofed and broken answers are dropped and counted while the
//! real one still gets through; silence ends in SERVFAIL (or nothing); dead upstreams are
//! skipped until a probe finds them back.

use std::net::Ipv4Addr;
use std::time::Duration;

use fqdnd_dnsproxy::{DropReason, QueryResult, UpstreamTimeoutAction};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;

use crate::harness::{
    Harness, Mode, advance, ask_udp, eventually, ips, parse_reply, query, test_config, udp_client,
    udp_exchange, udp_recv,
};
use crate::upstream::{Fault, Rule, TestUpstream, answer};

const REAL: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

async fn with_fault(fault: Fault) -> Harness {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream.rule(
        "spoof.example.",
        Rule {
            faults: vec![fault],
            ..answer("spoof.example.", [REAL])
        },
    );
    let msg = ask_udp(h.udp, "spoof.example.", RecordType::A).await;
    assert_eq!(ips(&msg), [REAL].into(), "the real answer is delivered");
    let observed = h.observer.seen_name("spoof.example.");
    assert_eq!(observed.len(), 1, "only the real answer is observed");
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_id_is_dropped_and_counted() {
    let h = with_fault(Fault::WrongId).await;
    assert_eq!(h.settled().await.dropped(DropReason::UnknownId), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_question_is_dropped_and_counted() {
    let h = with_fault(Fault::WrongQuestion).await;
    assert_eq!(h.settled().await.dropped(DropReason::QuestionMismatch), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_dropped_and_counted() {
    let h = with_fault(Fault::Garbage).await;
    assert_eq!(h.settled().await.dropped(DropReason::Malformed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_from_another_port_never_reaches_the_proxy() {
    // The connected upstream socket makes the kernel drop it: nothing to count, and the
    // forged address (6.6.6.6) never reaches the client or the observer.
    let h = with_fault(Fault::OtherSocket).await;
    assert_eq!(h.settled().await.dropped_total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_duplicate_is_dropped_and_counted() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream.rule(
        "dup.example.",
        Rule {
            twice: true,
            ..answer("dup.example.", [REAL])
        },
    );
    let msg = ask_udp(h.udp, "dup.example.", RecordType::A).await;
    assert_eq!(ips(&msg), [REAL].into());
    assert!(eventually(|| h.stats().dropped(DropReason::Duplicate) == 1).await);
    assert_eq!(h.observer.seen().len(), 1);
}

/// `timeout` plus one sweep period (`timeout / 8`, at least 5 ms), rounded up to the
/// millisecond: by then a sweep has found a query sent `timeout` ago.
fn swept(timeout: Duration) -> Duration {
    timeout + (timeout / 8).max(Duration::from_millis(5)) + Duration::from_millis(1)
}

#[tokio::test(start_paused = true)]
async fn answer_after_the_timeout_is_late() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_timeout = Duration::from_millis(150);
    })
    .await;
    h.upstream.rule(
        "slow.example.",
        Rule {
            delay: Duration::from_millis(400),
            ..answer("slow.example.", [REAL])
        },
    );
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let q = query("slow.example.", RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    assert!(eventually(|| h.upstream.count("slow.example.", false) == 1).await);
    advance(swept(Duration::from_millis(150))).await;
    let r = udp_recv(&client).await;
    assert_eq!(
        parse_reply(&q, &r).metadata.response_code,
        ResponseCode::ServFail
    );
    assert_eq!(h.stats().dropped(DropReason::Late), 0);
    // The upstream answers 400 ms after the query: too late.
    advance(Duration::from_millis(400)).await;
    assert!(eventually(|| h.stats().dropped(DropReason::Late) == 1).await);
    assert!(h.observer.seen().is_empty());
    assert_eq!(h.settled().await.queries(QueryResult::UpstreamTimeout), 1);
}

#[tokio::test(start_paused = true)]
async fn silent_upstream_gives_servfail_within_the_timeout() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_timeout = Duration::from_millis(300);
        // No health probe: its answer would reset the failure count checked below.
        c.health_check_interval = Duration::from_secs(3600);
    })
    .await;
    h.upstream.rule(
        "quiet.example.",
        Rule {
            silent: true,
            ..Rule::default()
        },
    );
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let q = query("quiet.example.", RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    assert!(eventually(|| h.upstream.count("quiet.example.", false) == 1).await);
    // Forwarded at this instant of the paused clock.
    advance(Duration::from_millis(299)).await;
    assert_eq!(
        h.stats().queries(QueryResult::UpstreamTimeout),
        0,
        "not before the timeout"
    );
    // The first sweep at or after 300 ms finds it (a sweep every 300 / 8 = 37.5 ms).
    advance(Duration::from_millis(38)).await;
    let r = udp_recv(&client).await;
    assert_eq!(
        parse_reply(&q, &r).metadata.response_code,
        ResponseCode::ServFail
    );
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::UpstreamTimeout), 1);
    assert_eq!(stats.upstreams[0].consecutive_failures, 1);
    assert!(stats.upstreams[0].alive);
    assert_eq!(stats.inflight, 0);
    let total = h.log.entries.lock().unwrap()[0].total_us;
    assert!((300_000..=337_500).contains(&total), "{total} µs");
}

#[tokio::test(start_paused = true)]
async fn no_reply_mode_sends_nothing() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_timeout = Duration::from_millis(200);
        c.on_upstream_timeout = UpstreamTimeoutAction::NoReply;
    })
    .await;
    h.upstream.rule(
        "quiet.example.",
        Rule {
            silent: true,
            ..Rule::default()
        },
    );
    h.upstream
        .rule("www.example.", answer("www.example.", [REAL]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let quiet = query("quiet.example.", RecordType::A, None);
    client.send_to(&quiet, h.udp).await.unwrap();
    assert!(eventually(|| h.upstream.count("quiet.example.", false) == 1).await);
    advance(swept(Duration::from_millis(200))).await;
    // Counted once whatever it sends has been sent.
    assert!(eventually(|| h.stats().queries(QueryResult::UpstreamTimeout) == 1).await);
    // The same socket gets the next query's answer first: nothing came before it.
    let q = query("www.example.", RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    let r = udp_recv(&client).await;
    assert_eq!(ips(&parse_reply(&q, &r)), [REAL].into());
    let log = h.log.entries.lock().unwrap().clone();
    assert_eq!(log[0].result, QueryResult::UpstreamTimeout);
    assert_eq!(log[0].rcode, "", "nothing was sent");
}

/// Asks `name` on the paused clock; a query that reached `down` is moved past its timeout.
async fn ask_advancing(h: &Harness, b: &TestUpstream, name: &str, timeout: Duration) -> Message {
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let q = query(name, RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    let reached = |u: &TestUpstream| u.count(name, false) == 1;
    assert!(eventually(|| reached(&h.upstream) || reached(b)).await);
    if reached(&h.upstream) {
        advance(swept(timeout)).await;
    }
    parse_reply(&q, &udp_recv(&client).await)
}

#[tokio::test(start_paused = true)]
async fn dead_upstream_is_skipped_then_comes_back() {
    let a = TestUpstream::start().await;
    let b = TestUpstream::start().await;
    for up in [&a, &b] {
        for i in 0..20 {
            let name = format!("h{i}.example.");
            up.rule(&name, answer(&name, [REAL]));
        }
    }
    let timeout = Duration::from_millis(200);
    let interval = Duration::from_secs(10);
    let mut config = test_config(vec![a.addr, b.addr]);
    config.upstream_timeout = timeout;
    config.health_check_interval = interval;
    config.health_check_failures = 2;
    let h = Harness::with(a, config, Mode::Done).await;
    h.upstream.set_down(true); // upstream `a`

    // Round robin sends every other query of a listener to `a` until it is marked dead;
    // those get SERVFAIL at the timeout, the others are answered by `b`.
    for i in 0..6 {
        let _ = ask_advancing(&h, &b, &format!("h{i}.example."), timeout).await;
    }
    let stats = h.settled().await;
    assert!(!stats.upstreams[0].alive, "{stats:?}");
    assert!(stats.upstreams[1].alive);

    // Dead: every query goes to `b` and is answered as the clock stands.
    let seen_by_a = h.upstream.queries().len();
    for i in 6..14 {
        let msg = ask_udp(h.udp, &format!("h{i}.example."), RecordType::A).await;
        assert_eq!(ips(&msg), [REAL].into());
    }
    assert_eq!(h.upstream.queries().len(), seen_by_a);
    // The health check probes it with `. NS` (unanswered: it is down).
    advance(interval).await;
    assert!(
        eventually(|| h.upstream.seen().iter().any(|s| s.name == ".")).await,
        "`a` is probed with . NS"
    );
    advance(swept(timeout)).await;
    assert!(eventually(|| h.stats().inflight == 0).await);
    assert!(!h.stats().upstreams[0].alive);

    // Back: the next probe finds it and it gets queries again.
    h.upstream.set_down(false);
    advance(interval).await;
    assert!(eventually(|| h.stats().upstreams[0].alive).await);
    for i in 14..20 {
        let msg = ask_udp(h.udp, &format!("h{i}.example."), RecordType::A).await;
        assert_eq!(ips(&msg), [REAL].into());
    }
    assert!(h.upstream.queries().len() > seen_by_a);
    drop(b);
}

#[tokio::test(start_paused = true)]
async fn no_live_upstream_is_servfail_at_once() {
    let timeout = Duration::from_millis(300);
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_timeout = timeout;
        c.health_check_failures = 1;
        c.health_check_interval = Duration::from_secs(60);
    })
    .await;
    h.upstream.set_down(true);
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let x = query("x.example.", RecordType::A, None);
    client.send_to(&x, h.udp).await.unwrap();
    assert!(eventually(|| h.upstream.count("x.example.", false) == 1).await);
    advance(swept(timeout)).await;
    let first = parse_reply(&x, &udp_recv(&client).await);
    assert_eq!(first.metadata.response_code, ResponseCode::ServFail);
    assert!(!h.stats().upstreams[0].alive);
    // The clock stands still from here: a SERVFAIL now is not a timeout.
    let y = query("y.example.", RecordType::A, None);
    client.send_to(&y, h.udp).await.unwrap();
    let second = parse_reply(&y, &udp_recv(&client).await);
    assert_eq!(second.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(h.upstream.count("y.example.", false), 0, "not forwarded");
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::NoUpstream), 1);
    assert_eq!(stats.queries(QueryResult::UpstreamTimeout), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_from_another_address_never_reaches_the_proxy() {
    // From the upstream's port on 127.0.0.2: the connected socket makes the kernel drop it.
    let h = with_fault(Fault::OtherAddress).await;
    assert_eq!(h.settled().await.dropped_total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_servfail_is_passed_through_observed_and_keeps_the_upstream_alive() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream.rule(
        "broken.example.",
        Rule {
            rcode: ResponseCode::ServFail,
            ..Rule::default()
        },
    );
    let q = query("broken.example.", RecordType::A, Some((1232, false)));
    let r = udp_exchange(h.udp, &q).await;
    assert_eq!(
        parse_reply(&q, &r).metadata.response_code,
        ResponseCode::ServFail
    );
    assert_eq!(
        &r[2..],
        &h.upstream.last_sent("broken.example.").unwrap()[2..],
        "the upstream's bytes, only the ID rewritten"
    );
    let observed = h.observer.seen_name("broken.example.");
    assert_eq!(observed.len(), 1, "observed (it teaches nothing)");
    assert_eq!(observed[0].rcode, ResponseCode::ServFail);
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Answered), 1);
    assert!(stats.upstreams[0].alive);
    assert_eq!(
        stats.upstreams[0].consecutive_failures, 0,
        "an answer, not a failure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_cut_short_mid_record_is_dropped_and_the_query_times_out() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_timeout = Duration::from_millis(300)
    })
    .await;
    h.upstream.rule(
        "cut.example.",
        Rule {
            cut_short: true,
            ..answer("cut.example.", [REAL, Ipv4Addr::new(192, 0, 2, 2)])
        },
    );
    let msg = ask_udp(h.udp, "cut.example.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    let stats = h.settled().await;
    assert_eq!(stats.dropped(DropReason::Malformed), 1);
    assert_eq!(stats.queries(QueryResult::UpstreamTimeout), 1);
    assert!(
        h.observer.seen().is_empty(),
        "nothing half-parsed is learned"
    );
}
