//! Allowed queries: forwarded untouched but for the ID, answers passed back untouched but for
//! the ID, every answer observed.

use std::net::Ipv4Addr;

use fqdnd_dnsproxy::{QueryResult, Transport};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};

use crate::harness::{Harness, Mode, ask_udp, ips, parse_reply, query, udp_exchange};
use crate::upstream::{Rule, a_records, answer, cname};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_answer_is_byte_identical_but_for_the_id() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    let ip = Ipv4Addr::new(192, 0, 2, 1);
    h.upstream
        .rule("www.example.", answer("www.example.", [ip]));
    let q = query("WWW.Example.", RecordType::A, Some((1232, false)));
    let r = udp_exchange(h.udp, &q).await;
    let msg = parse_reply(&q, &r);
    assert_eq!(ips(&msg), [ip].into());
    let sent = h.upstream.last_sent("www.example.").unwrap();
    assert_eq!(
        &r[2..],
        &sent[2..],
        "the answer passes through untouched but for the ID"
    );
    let seen = h.upstream.queries();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        &seen[0].raw[2..],
        &q[2..],
        "the query passes through untouched but for the ID"
    );
    assert_ne!(
        &seen[0].raw[..2],
        &q[..2],
        "the upstream sees the proxy's own ID"
    );

    let observed = h.observer.seen();
    assert_eq!(observed.len(), 1);
    assert_eq!(observed[0].name, "www.example.", "canonical name");
    assert_eq!(observed[0].tag, 7);
    assert_eq!(observed[0].transport, Transport::Udp);
    assert_eq!(observed[0].upstream, h.upstream.addr);
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Answered), 1);
    assert_eq!(stats.transport(Transport::Udp), 1, "counted with its batch");
    assert_eq!(stats.inflight, 0);
    assert_eq!(stats.dropped_total(), 0);
    assert!(stats.upstreams[0].last_rtt.is_some());
    let log = h.log.entries.lock().unwrap().clone();
    assert_eq!(log.len(), 1);
    assert_eq!(
        (log[0].result, log[0].rcode.as_str(), log[0].answers),
        (QueryResult::Answered, "NOERROR", 1)
    );
    assert_eq!(log[0].upstream, Some(h.upstream.addr));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nxdomain_is_passed_through_and_observed() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    let msg = ask_udp(h.udp, "nothing.example.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NXDomain);
    let observed = h.observer.seen_name("nothing.example.");
    assert_eq!(observed.len(), 1);
    assert_eq!(observed[0].rcode, ResponseCode::NXDomain);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cname_chain_passes_through_and_is_observed_whole() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    let mut records = vec![
        cname("alias.example.", "mid.example."),
        cname("mid.example.", "target.example."),
    ];
    records.extend(a_records(
        "target.example.",
        [Ipv4Addr::new(192, 0, 2, 7), Ipv4Addr::new(192, 0, 2, 8)],
    ));
    h.upstream.rule(
        "alias.example.",
        Rule {
            records,
            ..Rule::default()
        },
    );
    let msg = ask_udp(h.udp, "alias.example.", RecordType::A).await;
    assert_eq!(msg.answers.len(), 4);
    assert_eq!(ips(&msg).len(), 2);
    let observed = h.observer.seen_name("alias.example.");
    assert_eq!(observed[0].answers, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edns_do_bit_and_options_reach_the_upstream_and_come_back() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream.rule(
        "signed.example.",
        answer("signed.example.", [Ipv4Addr::new(192, 0, 2, 9)]),
    );
    let q = query("signed.example.", RecordType::A, Some((4096, true)));
    let r = udp_exchange(h.udp, &q).await;
    let upstream_saw = Message::from_vec(&h.upstream.queries()[0].raw).unwrap();
    let edns = upstream_saw.edns.as_ref().unwrap();
    assert!(edns.flags().dnssec_ok);
    assert_eq!(edns.max_payload(), 4096);
    assert_eq!(
        edns.option(EdnsCode::Unknown(65_001)),
        Some(&EdnsOption::Unknown(65_001, b"fqdnd".to_vec()))
    );
    let reply = parse_reply(&q, &r);
    assert!(
        reply.edns.as_ref().unwrap().flags().dnssec_ok,
        "DO comes back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_queries_at_once_are_all_answered_with_their_own_ids() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    for i in 0..50u8 {
        let name = format!("n{i}.example.");
        h.upstream
            .rule(&name, answer(&name, [Ipv4Addr::new(10, 0, 0, i)]));
    }
    let mut tasks = Vec::new();
    for i in 0..50u8 {
        let server = h.udp;
        tasks.push(tokio::spawn(async move {
            let msg = ask_udp(server, &format!("n{i}.example."), RecordType::A).await;
            assert_eq!(ips(&msg), [Ipv4Addr::new(10, 0, 0, i)].into());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(h.settled().await.queries(QueryResult::Answered), 50);
    // The proxy's upstream IDs are not sequential.
    let ids: Vec<u16> = h
        .upstream
        .queries()
        .iter()
        .map(|s| u16::from_be_bytes([s.raw[0], s.raw[1]]))
        .collect();
    let sequential = ids
        .windows(2)
        .filter(|w| w[1] == w[0].wrapping_add(1))
        .count();
    assert!(sequential < 3, "{ids:?}");
    // They leave from the configured 2 sockets, each with its own port.
    let ports: std::collections::HashSet<_> =
        h.upstream.queries().iter().map(|s| s.from.port()).collect();
    assert_eq!(ports.len(), 2);
}
