//! A hostile or failing upstream: spoofed and broken answers are dropped and counted while the
//! real one still gets through; silence ends in SERVFAIL (or nothing); dead upstreams are
//! skipped until a probe finds them back.

use std::net::Ipv4Addr;
use std::time::Duration;

use fqdnd_dnsproxy::{DropReason, QueryResult, UpstreamTimeoutAction};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use tokio::time::Instant;

use crate::harness::{
    Harness, Mode, ask_udp, eventually, ips, parse_reply, query, test_config, udp_exchange,
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
    assert!(
        eventually(Duration::from_secs(2), || h
            .stats()
            .dropped(DropReason::Duplicate)
            == 1)
        .await
    );
    assert_eq!(h.observer.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_after_the_timeout_is_late() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_timeout = Duration::from_millis(150)
    })
    .await;
    h.upstream.rule(
        "slow.example.",
        Rule {
            delay: Duration::from_millis(400),
            ..answer("slow.example.", [REAL])
        },
    );
    let msg = ask_udp(h.udp, "slow.example.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    assert!(
        eventually(Duration::from_secs(2), || h
            .stats()
            .dropped(DropReason::Late)
            == 1)
        .await
    );
    assert!(h.observer.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_upstream_gives_servfail_within_the_timeout() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_timeout = Duration::from_millis(300)
    })
    .await;
    h.upstream.rule(
        "quiet.example.",
        Rule {
            silent: true,
            ..Rule::default()
        },
    );
    let start = Instant::now();
    let q = query("quiet.example.", RecordType::A, None);
    let r = udp_exchange(h.udp, &q, Duration::from_secs(3))
        .await
        .unwrap();
    let waited = start.elapsed();
    assert_eq!(
        parse_reply(&q, &r).metadata.response_code,
        ResponseCode::ServFail
    );
    // The timeout plus at most one sweep period (timeout / 8), plus scheduling slack.
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1000),
        "{waited:?}"
    );
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::UpstreamTimeout), 1);
    assert_eq!(stats.upstreams[0].consecutive_failures, 1);
    assert!(stats.upstreams[0].alive);
    assert_eq!(stats.inflight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    let q = query("quiet.example.", RecordType::A, None);
    assert!(
        udp_exchange(h.udp, &q, Duration::from_millis(800))
            .await
            .is_none()
    );
    assert_eq!(h.settled().await.queries(QueryResult::UpstreamTimeout), 1);
    let log = h.log.entries.lock().unwrap().clone();
    assert_eq!(log[0].rcode, "", "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_upstream_is_skipped_then_comes_back() {
    let a = TestUpstream::start().await;
    let b = TestUpstream::start().await;
    for up in [&a, &b] {
        for i in 0..20 {
            let name = format!("h{i}.example.");
            up.rule(&name, answer(&name, [REAL]));
        }
    }
    let (a_addr, b_addr) = (a.addr, b.addr);
    let mut config = test_config(vec![a_addr, b_addr]);
    config.upstream_timeout = Duration::from_millis(200);
    config.health_check_interval = Duration::from_millis(150);
    config.health_check_failures = 2;
    let h = Harness::with(a, config, Mode::Done).await;
    h.upstream.set_down(true); // upstream `a`

    // Round robin sends about half the queries to `a` until it is marked dead; those get
    // SERVFAIL after the timeout, the others are answered by `b`.
    for i in 0..6 {
        let _ = ask_udp(h.udp, &format!("h{i}.example."), RecordType::A).await;
    }
    let stats = h.settled().await;
    assert!(!stats.upstreams[0].alive, "{stats:?}");
    assert!(stats.upstreams[1].alive);

    // Dead: every query goes to `b` and is answered at once.
    let seen_by_a = h.upstream.queries().len();
    for i in 6..14 {
        let msg = ask_udp(h.udp, &format!("h{i}.example."), RecordType::A).await;
        assert_eq!(ips(&msg), [REAL].into());
    }
    assert_eq!(h.upstream.queries().len(), seen_by_a);
    assert!(
        h.upstream.seen().iter().any(|s| s.name == "."),
        "`a` is probed with . NS"
    );

    // Back: the next probe finds it and it gets queries again.
    h.upstream.set_down(false);
    assert!(eventually(Duration::from_secs(2), || h.stats().upstreams[0].alive).await);
    for i in 14..20 {
        let msg = ask_udp(h.udp, &format!("h{i}.example."), RecordType::A).await;
        assert_eq!(ips(&msg), [REAL].into());
    }
    assert!(h.upstream.queries().len() > seen_by_a);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_live_upstream_is_servfail_at_once() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_timeout = Duration::from_millis(300);
        c.health_check_failures = 1;
        c.health_check_interval = Duration::from_secs(60);
    })
    .await;
    h.upstream.set_down(true);
    let first = ask_udp(h.udp, "x.example.", RecordType::A).await;
    assert_eq!(first.metadata.response_code, ResponseCode::ServFail);
    assert!(!h.stats().upstreams[0].alive);
    let start = Instant::now();
    let second = ask_udp(h.udp, "y.example.", RecordType::A).await;
    assert_eq!(second.metadata.response_code, ResponseCode::ServFail);
    assert!(
        start.elapsed() < Duration::from_millis(250),
        "not after the 300 ms timeout"
    );
    assert_eq!(h.settled().await.queries(QueryResult::NoUpstream), 1);
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
    let r = udp_exchange(h.udp, &q, Duration::from_secs(3))
        .await
        .unwrap();
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
