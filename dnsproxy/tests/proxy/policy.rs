//! Policy verdicts and malformed queries: answered by the proxy itself, never forwarded.

use std::net::Ipv4Addr;

use fqdnd_dnsproxy::{QueryResult, RejectCode};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::harness::{
    Harness, Mode, UNKNOWN_CLIENT, parse_reply, query, udp_client, udp_exchange, udp_recv,
};
use crate::upstream::answer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_is_refused_and_never_forwarded() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream.rule(
        "denied.example.",
        answer("denied.example.", [Ipv4Addr::new(1, 1, 1, 1)]),
    );
    let q = query("Denied.Example.", RecordType::A, Some((1232, true)));
    let r = udp_exchange(h.udp, &q).await;
    let msg = parse_reply(&q, &r);
    assert_eq!(msg.metadata.response_code, ResponseCode::Refused);
    assert_eq!(msg.queries.len(), 1, "the question is echoed");
    assert!(msg.answers.is_empty());
    assert!(
        msg.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok),
        "OPT echoed with DO"
    );
    assert_eq!(h.upstream.count("denied.example.", false), 0);
    assert!(h.observer.seen().is_empty());
    assert_eq!(h.settled().await.queries(QueryResult::Denied), 1);
    let log = h.log.entries.lock().unwrap().clone();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].name, "denied.example.");
    assert_eq!(log[0].result, QueryResult::Denied);
    assert_eq!(log[0].rcode, "REFUSED");
    assert_eq!(log[0].qtype, "A");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_is_nxdomain_when_configured() {
    let h = Harness::start(Mode::Done, |c| c.reject_code = RejectCode::NxDomain).await;
    let q = query("denied.example.", RecordType::AAAA, None);
    let r = udp_exchange(h.udp, &q).await;
    let msg = parse_reply(&q, &r);
    assert_eq!(msg.metadata.response_code, ResponseCode::NXDomain);
    assert!(msg.edns.is_none(), "no OPT when the query had none");
    assert_eq!(h.upstream.queries().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_client_is_refused_whatever_the_reject_code() {
    let h = Harness::start(Mode::Done, |c| c.reject_code = RejectCode::NxDomain).await;
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(1, 1, 1, 1)]),
    );
    let client = udp_client(UNKNOWN_CLIENT).await;
    let q = query("www.example.", RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    let r = udp_recv(&client).await;
    assert_eq!(
        parse_reply(&q, &r).metadata.response_code,
        ResponseCode::Refused
    );
    assert_eq!(h.upstream.queries().len(), 0);
    assert_eq!(h.settled().await.queries(QueryResult::UnknownClient), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_query_gets_formerr_and_unreadable_gets_nothing() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    // A header announcing one question, then a label running past the end.
    let bad = [0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0x3f, b'x'];
    let r = udp_exchange(h.udp, &bad).await;
    assert_eq!(&r[..2], &[0xab, 0xcd]);
    assert_eq!(r[2] & 0x80, 0x80, "QR");
    assert_eq!(r[3] & 0x0f, 1, "FORMERR");
    // Two questions: parsable but not a query the proxy forwards.
    let mut two = query("a.example.", RecordType::A, None);
    let question = two[12..].to_vec();
    two[5] = 2;
    two.extend_from_slice(&question);
    let r = udp_exchange(h.udp, &two).await;
    assert_eq!(r[3] & 0x0f, 1, "FORMERR for two questions");
    // One byte (shorter than a header, see `runts`) and a response sent to the proxy: never
    // answered. From one socket the datagrams are handled in order, so the first reply must be
    // the one to the denied query sent after them.
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let mut resp = query("a.example.", RecordType::A, None);
    resp[2] |= 0x80;
    let denied = query("denied.example.", RecordType::A, None);
    for datagram in [&[0x42][..], &resp, &denied] {
        client.send_to(datagram, h.udp).await.unwrap();
    }
    let r = udp_recv(&client).await;
    assert_eq!(
        parse_reply(&denied, &r).metadata.response_code,
        ResponseCode::Refused
    );
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Denied), 1);
    assert_eq!(stats.queries(QueryResult::Malformed), 3);
    assert_eq!(stats.runt_queries, 1);
    assert_eq!(h.upstream.queries().len(), 0);
}
