//! The answer cache: the verdict runs first, a cached answer is observed (with its remaining
//! TTLs) and held like an upstream answer, TTLs are decremented, negative answers are kept
//! per RFC 2308, the bound holds, and client groups do not share entries.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::harness::{
    Harness, Mode, advance, eventually, ips, parse_reply, query, run_ready, test_config,
    udp_client, udp_recv, udp_recv_within,
};
use crate::upstream::{TestUpstream, answer};
use fqdnd_dnsproxy::{CacheConfig, Config, QueryInfo, QueryPolicy, QueryResult, Verdict};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::SOA;
use hickory_proto::rr::{Name, RData, Record, RecordType};

const IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// A second client address: another client group for [`Groups`].
const OTHER_GROUP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

/// Tag 1 for 127.0.0.1, tag 2 for [`OTHER_GROUP`]; names starting with `flip.` are denied
/// once `deny_flip` is set.
struct Groups {
    deny_flip: AtomicBool,
}

impl QueryPolicy for Groups {
    fn check(&self, query: &QueryInfo<'_>) -> Verdict {
        if query.name.starts_with("flip.") && self.deny_flip.load(Ordering::SeqCst) {
            return Verdict::Deny { tag: 1 };
        }
        Verdict::Allow {
            tag: if query.client.ip() == OTHER_GROUP {
                2
            } else {
                1
            },
        }
    }
}

fn cached(config: &mut Config) {
    config.cache = Some(CacheConfig::default());
}

async fn start(policy: Arc<Groups>, mode: Mode, tweak: impl FnOnce(&mut Config)) -> Harness {
    let upstream = TestUpstream::start().await;
    let mut config = test_config(vec![upstream.addr]);
    cached(&mut config);
    tweak(&mut config);
    Harness::with_policy(upstream, config, mode, policy).await
}

fn groups() -> Arc<Groups> {
    Arc::new(Groups {
        deny_flip: AtomicBool::new(false),
    })
}

/// Asks `name` from `client` and returns the reply.
async fn ask(h: &Harness, client: &tokio::net::UdpSocket, name: &str) -> Message {
    let q = query(name, RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    parse_reply(&q, &udp_recv(client).await)
}

fn ttls(msg: &Message) -> Vec<u32> {
    msg.answers
        .iter()
        .chain(&msg.authorities)
        .map(|r| r.ttl)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_name_is_never_served_from_the_cache() {
    let policy = groups();
    let h = start(policy.clone(), Mode::Done, |_| {}).await;
    h.upstream
        .rule("flip.example.", answer("flip.example.", [IP]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    assert_eq!(ips(&ask(&h, &client, "flip.example.").await), [IP].into());
    assert_eq!(ips(&ask(&h, &client, "flip.example.").await), [IP].into());
    assert_eq!(
        h.upstream.count("flip.example.", false),
        1,
        "the second from the cache"
    );
    policy.deny_flip.store(true, Ordering::SeqCst);
    let r = ask(&h, &client, "flip.example.").await;
    assert_eq!(r.metadata.response_code, ResponseCode::Refused);
    assert!(r.answers.is_empty());
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Denied), 1);
    let cache = stats.cache.unwrap();
    assert_eq!(
        (cache.hits, cache.misses),
        (1, 1),
        "a denied query never reaches the cache"
    );
    assert_eq!(h.upstream.count("flip.example.", false), 1);
    h.stop().await;
}

/// On the paused clock the hold cannot time out: a cached answer reaches the client only once
/// the observer, shown it with its remaining TTL, has finished.
#[tokio::test(start_paused = true)]
async fn a_cached_answer_is_observed_and_held_before_release() {
    let h = start(groups(), Mode::Gated, |c| {
        c.response_max_delay = Duration::from_secs(10);
    })
    .await;
    h.upstream
        .rule("held.example.", answer("held.example.", [IP]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let q = query("held.example.", RecordType::A, None);
    client.send_to(&q, h.udp).await.unwrap();
    assert!(eventually(|| h.observer.seen().len() == 1).await);
    h.observer.release();
    udp_recv(&client).await;
    assert!(eventually(|| h.stats().cache.unwrap().inserts == 1).await);

    advance(Duration::from_secs(20)).await;
    client.send_to(&q, h.udp).await.unwrap();
    assert!(eventually(|| h.observer.seen().len() == 2).await);
    let seen = h.observer.seen();
    assert_eq!(
        seen[1].ttls,
        vec![40],
        "the engine learns the remaining TTL"
    );
    assert_eq!(seen[1].tag, 1);
    assert_eq!(seen[1].upstream, h.upstream.addr);
    run_ready().await;
    assert!(
        udp_recv_within(&client, Duration::from_millis(200))
            .await
            .is_none(),
        "held while observing"
    );
    assert_eq!(h.stats().queries(QueryResult::Answered), 1, "held");
    h.observer.release();
    let r = parse_reply(&q, &udp_recv(&client).await);
    assert_eq!(ips(&r), [IP].into());
    assert_eq!(ttls(&r), vec![40]);
    assert_eq!(h.upstream.count("held.example.", false), 1);
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::Answered), 2);
    assert_eq!(stats.cache.unwrap().hits, 1);
    h.stop().await;
}

/// A cached answer whose observer fails gets the hold fallback (SERVFAIL here), as an
/// upstream answer would: its IPs never reach the client unlearned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_answer_the_engine_cannot_learn_is_not_released() {
    let h = start(groups(), Mode::Done, |c| {
        c.on_hold_timeout = fqdnd_dnsproxy::HoldFallback::ServFail;
    })
    .await;
    h.upstream
        .rule("fail.example.", answer("fail.example.", [IP]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    assert_eq!(ips(&ask(&h, &client, "fail.example.").await), [IP].into());
    *h.observer.mode.lock().unwrap() = Mode::Fail;
    let r = ask(&h, &client, "fail.example.").await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert!(r.answers.is_empty());
    let stats = h.settled().await;
    assert_eq!(stats.cache.unwrap().hits, 1);
    assert_eq!(stats.queries(QueryResult::ObserverFailed), 1);
    assert_eq!(h.upstream.count("fail.example.", false), 1);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn ttls_are_decremented_and_an_expired_entry_is_asked_again() {
    let h = start(groups(), Mode::Done, |_| {}).await;
    h.upstream
        .rule("ttl.example.", answer("ttl.example.", [IP]));
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    assert_eq!(ttls(&ask(&h, &client, "ttl.example.").await), vec![60]);
    advance(Duration::from_millis(25_500)).await;
    assert_eq!(ttls(&ask(&h, &client, "ttl.example.").await), vec![35]);
    advance(Duration::from_secs(34)).await;
    assert_eq!(ttls(&ask(&h, &client, "ttl.example.").await), vec![1]);
    assert_eq!(h.upstream.count("ttl.example.", false), 1);
    advance(Duration::from_secs(1)).await;
    assert_eq!(
        ttls(&ask(&h, &client, "ttl.example.").await),
        vec![60],
        "expired: asked again"
    );
    assert_eq!(h.upstream.count("ttl.example.", false), 2);
    let cache = h.settled().await.cache.unwrap();
    assert_eq!((cache.hits, cache.misses, cache.expired), (2, 2, 1));
    h.stop().await;
}

fn soa(ttl: u32, minimum: u32) -> Record {
    let n = |s: &str| Name::from_ascii(s).unwrap();
    Record::from_rdata(
        n("example."),
        ttl,
        RData::SOA(SOA::new(
            n("ns.example."),
            n("admin.example."),
            1,
            3600,
            600,
            86400,
            minimum,
        )),
    )
}

#[tokio::test(start_paused = true)]
async fn negative_answers_are_cached_for_the_soa_minimum() {
    let h = start(groups(), Mode::Done, |_| {}).await;
    h.upstream.rule(
        "gone.example.",
        crate::upstream::Rule {
            rcode: ResponseCode::NXDomain,
            authority: vec![soa(300, 30)],
            ..Default::default()
        },
    );
    h.upstream.rule(
        "nosoa.example.",
        crate::upstream::Rule {
            rcode: ResponseCode::NXDomain,
            ..Default::default()
        },
    );
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let r = ask(&h, &client, "gone.example.").await;
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(ttls(&r), vec![300], "the first reply is the upstream's");
    advance(Duration::from_secs(10)).await;
    let r = ask(&h, &client, "gone.example.").await;
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(ttls(&r), vec![20], "cut to MINIMUM (30), less 10 s");
    assert_eq!(h.upstream.count("gone.example.", false), 1);
    advance(Duration::from_secs(20)).await;
    ask(&h, &client, "gone.example.").await;
    assert_eq!(
        h.upstream.count("gone.example.", false),
        2,
        "expired after 30 s"
    );
    // Without an SOA: not cached.
    ask(&h, &client, "nosoa.example.").await;
    ask(&h, &client, "nosoa.example.").await;
    assert_eq!(h.upstream.count("nosoa.example.", false), 2);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_and_evictions_are_counted() {
    let h = start(groups(), Mode::Done, |c| {
        c.cache = Some(CacheConfig {
            max_entries: 10,
            ..CacheConfig::default()
        });
    })
    .await;
    let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    for i in 0..50 {
        let name = format!("n{i}.example.");
        h.upstream.rule(&name, answer(&name, [IP]));
        assert_eq!(ips(&ask(&h, &client, &name).await), [IP].into());
        assert!(eventually(|| h.stats().cache.unwrap().inserts == i + 1).await);
        assert!(h.stats().cache.unwrap().entries <= 10, "after {i}");
    }
    let cache = h.settled().await.cache.unwrap();
    assert_eq!(cache.capacity, 10);
    assert_eq!(cache.entries as u64 + cache.evictions, 50, "{cache:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_groups_and_edns_states_do_not_share_entries() {
    let h = start(groups(), Mode::Done, |_| {}).await;
    h.upstream
        .rule("iso.example.", answer("iso.example.", [IP]));
    let one = udp_client(Ipv4Addr::LOCALHOST.into()).await;
    let two = udp_client(OTHER_GROUP).await;
    ask(&h, &one, "iso.example.").await;
    ask(&h, &two, "iso.example.").await;
    assert_eq!(
        h.upstream.count("iso.example.", false),
        2,
        "group 2 has its own entry"
    );
    ask(&h, &one, "iso.example.").await;
    ask(&h, &two, "iso.example.").await;
    assert_eq!(
        h.upstream.count("iso.example.", false),
        2,
        "each group hits its own"
    );
    // With EDNS and the DO bit: another entry, whose reply carries the OPT record.
    let q = query("iso.example.", RecordType::A, Some((1232, true)));
    for round in 0..2 {
        one.send_to(&q, h.udp).await.unwrap();
        let r = parse_reply(&q, &udp_recv(&one).await);
        assert!(
            r.edns.as_ref().is_some_and(|e| e.flags().dnssec_ok),
            "round {round}"
        );
    }
    assert_eq!(h.upstream.count("iso.example.", false), 3);
    let seen = h.observer.seen_name("iso.example.");
    assert_eq!(seen.len(), 6, "every answer observed, cached or not");
    assert_eq!(seen.iter().filter(|o| o.tag == 2).count(), 2);
    let cache = h.settled().await.cache.unwrap();
    assert_eq!((cache.hits, cache.misses), (3, 3));
    h.stop().await;
}
