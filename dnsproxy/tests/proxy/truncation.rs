//! TC=1 from the upstream: retried over TCP, observed whole, then truncated again for a UDP
//! client it does not fit; passed through when configured.

use std::net::Ipv4Addr;

use fqdnd_dnsproxy::{QueryResult, Transport, TruncatedAction};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::harness::{Harness, Mode, TcpClient, ips, parse_reply, query, udp_exchange};
use crate::upstream::{Rule, answer};

fn five_hundred(name: &str) -> Rule {
    answer(name, (0..500u32).map(|i| Ipv4Addr::from(0x0a00_0000 + i)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_answer_udp_client_gets_tc_after_the_full_answer_was_observed() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream
        .rule("big.example.", five_hundred("big.example."));
    let q = query("big.example.", RecordType::A, Some((1232, true)));
    let r = udp_exchange(h.udp, &q).await;
    let msg = parse_reply(&q, &r);
    assert!(msg.metadata.truncation, "TC=1");
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError);
    assert_eq!(msg.queries.len(), 1);
    assert!(msg.answers.is_empty(), "question only");
    assert!(msg.edns.as_ref().unwrap().flags().dnssec_ok);
    assert!(r.len() <= 1232);
    assert_eq!(h.upstream.count("big.example.", false), 1);
    assert_eq!(
        h.upstream.count("big.example.", true),
        1,
        "retried over TCP"
    );
    let observed = h.observer.seen_name("big.example.");
    assert_eq!(observed.len(), 1, "only the full answer is observed");
    assert_eq!(observed[0].answers, 500);
    assert!(!observed[0].truncated);
    assert_eq!(h.settled().await.queries(QueryResult::Answered), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_answer_over_tcp_is_complete() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream
        .rule("big.example.", five_hundred("big.example."));
    let mut client = TcpClient::connect(h.tcp).await;
    let q = query("big.example.", RecordType::A, None);
    client.send_all(&[&q]).await;
    let r = client.recv().await.unwrap();
    let msg = parse_reply(&q, &r);
    assert!(!msg.metadata.truncation);
    assert_eq!(ips(&msg).len(), 500);
    let observed = h.observer.seen_name("big.example.");
    assert_eq!(observed.len(), 1);
    assert_eq!(observed[0].answers, 500);
    assert_eq!(observed[0].transport, Transport::Tcp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tc_answer_that_fits_after_retry_is_delivered_whole_over_udp() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    let ips_in = [Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2)];
    h.upstream.rule(
        "tc.example.",
        Rule {
            force_tc: true,
            ..answer("tc.example.", ips_in)
        },
    );
    let q = query("tc.example.", RecordType::A, Some((1232, false)));
    let r = udp_exchange(h.udp, &q).await;
    let msg = parse_reply(&q, &r);
    assert!(!msg.metadata.truncation);
    assert_eq!(ips(&msg), ips_in.into());
    assert_eq!(
        &r[2..],
        &h.upstream.last_sent("tc.example.").unwrap()[2..],
        "the TCP answer, untouched"
    );
    assert_eq!(h.upstream.count("tc.example.", true), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_releases_the_tc_answer_and_observes_it() {
    let h = Harness::start(Mode::Done, |c| {
        c.on_truncated = TruncatedAction::PassThrough
    })
    .await;
    h.upstream
        .rule("big.example.", five_hundred("big.example."));
    let q = query("big.example.", RecordType::A, Some((1232, false)));
    let r = udp_exchange(h.udp, &q).await;
    let msg = parse_reply(&q, &r);
    assert!(msg.metadata.truncation);
    assert_eq!(h.upstream.count("big.example.", true), 0, "no TCP retry");
    let observed = h.observer.seen_name("big.example.");
    assert_eq!(observed.len(), 1);
    assert!(observed[0].truncated);
    // The client's own retry over TCP gets everything.
    let mut client = TcpClient::connect(h.tcp).await;
    client.send_all(&[&q]).await;
    let r = client.recv().await.unwrap();
    assert_eq!(ips(&parse_reply(&q, &r)).len(), 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_without_edns_gets_tc_past_512_bytes() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    // 40 A records ≈ 660 bytes: over 512, under 1232.
    h.upstream.rule(
        "mid.example.",
        answer(
            "mid.example.",
            (0..40u32).map(|i| Ipv4Addr::from(0x0a00_0000 + i)),
        ),
    );
    let q = query("mid.example.", RecordType::A, None);
    let r = udp_exchange(h.udp, &q).await;
    let msg = parse_reply(&q, &r);
    assert!(msg.metadata.truncation);
    assert!(msg.edns.is_none());
    assert_eq!(h.observer.seen_name("mid.example.")[0].answers, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tc_answer_cut_mid_record_is_retried_over_tcp() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    let ips_in = [Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2)];
    h.upstream.rule(
        "cut.example.",
        Rule {
            force_tc: true,
            cut_short: true,
            ..answer("cut.example.", ips_in)
        },
    );
    let q = query("cut.example.", RecordType::A, Some((1232, false)));
    let r = udp_exchange(h.udp, &q).await;
    let msg = parse_reply(&q, &r);
    assert!(!msg.metadata.truncation);
    assert_eq!(
        ips(&msg),
        ips_in.into(),
        "the full answer, fetched over TCP"
    );
    assert_eq!(h.upstream.count("cut.example.", true), 1);
    let observed = h.observer.seen_name("cut.example.");
    assert_eq!(observed.len(), 1, "only the full answer is observed");
    assert_eq!(observed[0].answers, 2);
    assert_eq!(h.settled().await.dropped_total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tc_answer_cut_mid_record_is_passed_through_as_header_and_question() {
    let h = Harness::start(Mode::Done, |c| {
        c.on_truncated = TruncatedAction::PassThrough
    })
    .await;
    h.upstream.rule(
        "cut.example.",
        Rule {
            force_tc: true,
            cut_short: true,
            ..answer("cut.example.", [Ipv4Addr::new(192, 0, 2, 1)])
        },
    );
    let q = query("cut.example.", RecordType::A, Some((1232, false)));
    let r = udp_exchange(h.udp, &q).await;
    let msg = parse_reply(&q, &r);
    assert!(msg.metadata.truncation);
    assert!(msg.answers.is_empty() && msg.additionals.is_empty());
    assert_eq!(msg.queries.len(), 1);
    assert_eq!(h.upstream.count("cut.example.", true), 0, "no TCP retry");
    let observed = h.observer.seen_name("cut.example.");
    assert_eq!(observed.len(), 1);
    assert!(observed[0].truncated);
}
