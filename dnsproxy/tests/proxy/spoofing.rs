//! Off-path spoofing: answers are accepted only for an outstanding random ID on the connected
//! socket the query left from, with the query's question (and, with 0x20, its case). Sockets
//! move to fresh ports over time without losing the answers in flight on the old ones.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use fqdnd_dnsproxy::{DropReason, QueryResult};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::harness::{
    Harness, Mode, TcpClient, advance, ask_udp, eventually, ips, parse_reply, patiently, query,
    udp_client, udp_exchange, udp_recv,
};
use crate::upstream::{Fault, Rule, answer, question_name_end};

const REAL: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

/// The source ports the upstream saw queries for `name` come from, in order.
fn ports(h: &Harness, name: &str) -> Vec<u16> {
    h.upstream
        .queries()
        .iter()
        .filter(|s| s.name == name && !s.tcp)
        .map(|s| s.from.port())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_answers_is_dropped_and_counted() {
    const IDS: u16 = 400;
    const QUESTIONS: u16 = 60;
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream.rule(
        "target.example.",
        Rule {
            faults: vec![Fault::ForgedIds(IDS), Fault::ForgedQuestions(QUESTIONS)],
            ..answer("target.example.", [REAL])
        },
    );
    let msg = ask_udp(h.udp, "target.example.", RecordType::A).await;
    assert_eq!(
        ips(&msg),
        [REAL].into(),
        "only the real answer reaches the client"
    );
    let seen = h.observer.seen();
    assert_eq!(seen.len(), 1, "only the real answer is observed: {seen:?}");
    assert_eq!(seen[0].name, "target.example.");
    let all = u64::from(IDS + QUESTIONS);
    assert!(
        eventually(|| h.stats().dropped_total() == all).await,
        "{:?}",
        h.stats().dropped_answers
    );
    let stats = h.settled().await;
    assert_eq!(
        stats.dropped(DropReason::QuestionMismatch),
        u64::from(QUESTIONS)
    );
    // A random wrong ID is unknown on the socket, or (if it is a health probe's old ID)
    // a duplicate or late.
    let wrong_id = stats.dropped(DropReason::UnknownId)
        + stats.dropped(DropReason::Duplicate)
        + stats.dropped(DropReason::Late);
    assert_eq!(wrong_id, u64::from(IDS));
    assert_eq!(stats.queries(QueryResult::Answered), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_ids_are_spread_over_the_whole_space() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream
        .rule("ids.example.", answer("ids.example.", [REAL]));
    for _ in 0..200 {
        ask_udp(h.udp, "ids.example.", RecordType::A).await;
    }
    let ids: Vec<u16> = h
        .upstream
        .queries()
        .iter()
        .map(|s| u16::from_be_bytes([s.raw[0], s.raw[1]]))
        .collect();
    assert_eq!(ids.len(), 200);
    let distinct: HashSet<_> = ids.iter().collect();
    // 200 random draws of 2^16 collide about 0.3 times on average.
    assert!(distinct.len() >= 196, "{} distinct", distinct.len());
    let sequential = ids
        .windows(2)
        .filter(|w| w[1].wrapping_sub(w[0]) < 16)
        .count();
    assert!(sequential <= 2, "{sequential} close successors: {ids:?}");
    assert!(ids.iter().any(|&i| i >= 0x8000) && ids.iter().any(|&i| i < 0x8000));
}

/// On the paused clock the slow answer comes only when the test moves the clock: the fast
/// queries all rotate the slot while it is in flight on the first socket.
#[tokio::test(start_paused = true)]
async fn sockets_rotate_to_new_ports_and_answers_in_flight_on_the_old_one_arrive() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_sockets = 1;
        c.upstream_socket_max_queries = 1;
        c.upstream_socket_max_age = Duration::ZERO;
        c.upstream_timeout = Duration::from_secs(3);
    })
    .await;
    h.upstream.rule(
        "slow.example.",
        Rule {
            delay: Duration::from_millis(400),
            ..answer("slow.example.", [REAL])
        },
    );
    h.upstream
        .rule("fast.example.", answer("fast.example.", [REAL]));

    let server = h.udp;
    let slow = tokio::spawn(async move { ask_udp(server, "slow.example.", RecordType::A).await });
    assert!(eventually(|| !ports(&h, "slow.example.").is_empty()).await);
    // The socket carried its one query: the next query moves the slot to a new port, while
    // the slow answer is still to come on the old one.
    for _ in 0..5 {
        let msg = ask_udp(h.udp, "fast.example.", RecordType::A).await;
        assert_eq!(ips(&msg), [REAL].into());
    }
    assert!(!slow.is_finished());
    advance(Duration::from_millis(400)).await;
    let msg = patiently(slow).await.unwrap();
    assert_eq!(
        ips(&msg),
        [REAL].into(),
        "the answer on the retired socket arrives"
    );
    let mut all = ports(&h, "slow.example.");
    all.extend(ports(&h, "fast.example."));
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), 6, "one port per query: {all:?}");
    let stats = h.settled().await;
    assert_eq!(stats.upstream_socket_rotations, 5, "{stats:?}");
    assert_eq!(stats.upstream_socket_rotation_failures, 0);
    assert_eq!(stats.queries(QueryResult::Answered), 6);
    assert_eq!(stats.dropped_total(), 0);
}

/// The queries of one batch (six datagrams read by one `recvmmsg`) go to the socket the batch
/// queued to already only until it has carried `upstream_socket_max_queries`: then the slot
/// is rotated in the middle of the batch.
#[tokio::test(start_paused = true)]
async fn a_batch_moves_to_a_new_socket_when_the_one_it_queued_to_is_due() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_sockets = 1;
        c.upstream_socket_max_queries = 2;
        c.upstream_socket_max_age = Duration::ZERO;
    })
    .await;
    h.upstream
        .rule("burst.example.", answer("burst.example.", [REAL]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let queries: Vec<Vec<u8>> = (0..6)
        .map(|_| query("burst.example.", RecordType::A, None))
        .collect();
    // Sent before the proxy's task runs (the paused runtime has one thread): one batch.
    for q in &queries {
        client.send_to(q, h.udp).await.unwrap();
    }
    for _ in 0..6 {
        let reply = udp_recv(&client).await;
        let asked = queries.iter().find(|q| q[..2] == reply[..2]).unwrap();
        assert_eq!(ips(&parse_reply(asked, &reply)), [REAL].into());
    }
    let p = ports(&h, "burst.example.");
    assert_eq!(p.len(), 6);
    let distinct: HashSet<_> = p.iter().collect();
    assert_eq!(distinct.len(), 3, "two queries per socket: {p:?}");
    let stats = h.settled().await;
    assert_eq!(stats.upstream_socket_rotations, 2, "{stats:?}");
    assert_eq!(stats.queries(QueryResult::Answered), 6);
}

#[tokio::test(start_paused = true)]
async fn an_old_socket_is_replaced_by_the_next_query() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_sockets = 1;
        c.upstream_socket_max_queries = 0;
        c.upstream_socket_max_age = Duration::from_millis(300);
    })
    .await;
    h.upstream
        .rule("age.example.", answer("age.example.", [REAL]));
    ask_udp(h.udp, "age.example.", RecordType::A).await;
    ask_udp(h.udp, "age.example.", RecordType::A).await;
    advance(Duration::from_millis(400)).await;
    ask_udp(h.udp, "age.example.", RecordType::A).await;
    let p = ports(&h, "age.example.");
    assert_eq!(p[0], p[1], "young: same socket");
    assert_ne!(p[1], p[2], "old: a new port");
}

/// On the paused clock the quiet query can only time out once the test moves the clock, after
/// the fast one has retired its socket.
#[tokio::test(start_paused = true)]
async fn a_retired_socket_whose_query_times_out_still_gets_its_servfail() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_sockets = 1;
        c.upstream_socket_max_queries = 1;
        c.upstream_timeout = Duration::from_millis(300);
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
        .rule("fast.example.", answer("fast.example.", [REAL]));
    let server = h.udp;
    let quiet = tokio::spawn(async move { ask_udp(server, "quiet.example.", RecordType::A).await });
    assert!(eventually(|| !ports(&h, "quiet.example.").is_empty()).await);
    ask_udp(h.udp, "fast.example.", RecordType::A).await;
    assert_eq!(h.stats().upstream_socket_rotations, 1);
    // 300 ms and one sweep period (300 / 8).
    advance(Duration::from_millis(338)).await;
    let msg = patiently(quiet).await.unwrap();
    let p = ports(&h, "quiet.example.");
    assert_ne!(
        p,
        ports(&h, "fast.example."),
        "it timed out on the retired socket"
    );
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::UpstreamTimeout), 1);
}

/// The question name bytes (offset 12 to the root label) of a message.
fn name_bytes(raw: &[u8]) -> Vec<u8> {
    raw[12..question_name_end(raw)].to_vec()
}

const MIXED: &str = "CaseCheck.Example.TEST.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_case_goes_upstream_and_the_client_gets_its_own_back() {
    let h = Harness::start(Mode::Done, |c| c.randomize_case = true).await;
    h.upstream.rule(MIXED, answer(MIXED, [REAL]));
    for _ in 0..4 {
        let q = query(MIXED, RecordType::A, Some((1232, false)));
        let r = udp_exchange(h.udp, &q).await;
        assert_eq!(ips(&parse_reply(&q, &r)), [REAL].into());
        assert_eq!(name_bytes(&r), name_bytes(&q), "the client's spelling");
    }
    // Over TCP the query also leaves on the UDP sockets, randomised, and comes back restored.
    let mut tcp = TcpClient::connect(h.tcp).await;
    let q = query(MIXED, RecordType::A, None);
    tcp.send_all(&[&q]).await;
    let r = tcp.recv().await.unwrap();
    assert_eq!(ips(&parse_reply(&q, &r)), [REAL].into());
    assert_eq!(name_bytes(&r), name_bytes(&q), "the TCP client's spelling");

    let sent: HashSet<Vec<u8>> = h
        .upstream
        .queries()
        .iter()
        .map(|s| name_bytes(&s.raw))
        .collect();
    let client = name_bytes(&query(MIXED, RecordType::A, None));
    assert!(sent.len() >= 4, "5 queries, 2^16 spellings each: {sent:?}");
    for spelling in &sent {
        assert!(spelling.eq_ignore_ascii_case(&client));
    }
    assert_eq!(h.observer.seen_name("casecheck.example.test.").len(), 5);
    assert_eq!(h.settled().await.dropped_total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_in_another_case_is_dropped_with_0x20() {
    let h = Harness::start(Mode::Done, |c| {
        c.randomize_case = true;
        c.upstream_timeout = Duration::from_millis(300);
    })
    .await;
    h.upstream.rule(
        MIXED,
        Rule {
            lowercase_question: true,
            ..answer(MIXED, [REAL])
        },
    );
    let msg = ask_udp(h.udp, MIXED, RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    let stats = h.settled().await;
    assert_eq!(stats.dropped(DropReason::CaseMismatch), 1);
    assert_eq!(stats.queries(QueryResult::UpstreamTimeout), 1);
    assert!(h.observer.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_0x20_an_answer_in_another_case_is_accepted_in_the_clients_spelling() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream.rule(
        MIXED,
        Rule {
            lowercase_question: true,
            ..answer(MIXED, [REAL])
        },
    );
    let q = query(MIXED, RecordType::A, Some((1232, false)));
    let r = udp_exchange(h.udp, &q).await;
    assert_eq!(ips(&parse_reply(&q, &r)), [REAL].into());
    let sent = h.upstream.last_sent(MIXED).unwrap();
    assert_ne!(
        name_bytes(&sent),
        name_bytes(&q),
        "the upstream lowercased it"
    );
    assert_eq!(name_bytes(&r), name_bytes(&q), "the client's spelling");
    assert_eq!(h.settled().await.dropped_total(), 0);
}

/// With shard threads (a multi-thread runtime: `udp_threads: 2`), a socket rotated out is
/// closed once its last query was answered, or once the sweep expired it: its port can be
/// bound again. The socket in use stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_shard_threads_retired_sockets_close_once_drained() {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_sockets = 1;
        c.upstream_socket_max_queries = 1;
        c.upstream_socket_max_age = Duration::ZERO;
        c.upstream_timeout = Duration::from_millis(300);
    })
    .await;
    h.upstream.rule(
        "quiet.example.",
        Rule {
            silent: true,
            ..Rule::default()
        },
    );
    let server = h.udp;
    // A query that is never answered: its socket closes only once the sweep expires it.
    let quiet = tokio::spawn(async move { ask_udp(server, "quiet.example.", RecordType::A).await });
    assert!(eventually(|| !ports(&h, "quiet.example.").is_empty()).await);
    let mut used = ports(&h, "quiet.example.");
    for i in 0..3 {
        let name = format!("q{i}.example.");
        h.upstream.rule(&name, answer(&name, [REAL]));
        let msg = ask_udp(h.udp, &name, RecordType::A).await;
        assert_eq!(ips(&msg), HashSet::from([REAL]));
        used.extend(ports(&h, &name));
    }
    assert_eq!(h.stats().upstream_socket_rotations, 3);
    let msg = patiently(quiet).await.unwrap();
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    let (last, retired) = used.split_last().unwrap();
    assert_eq!(retired.len(), 3, "one port per query: {used:?}");
    for &port in retired {
        assert!(
            eventually(|| std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok()).await,
            "retired socket on port {port} still open"
        );
    }
    assert!(
        std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, *last)).is_err(),
        "the socket in use was closed"
    );
}
