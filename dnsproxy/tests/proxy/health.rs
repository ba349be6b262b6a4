//! Upstream health: failures are counted per timeout sweep, not per query, so a burst of
//! unanswered queries does not mark dead an upstream that answers the rest, while one that
//! answers nothing is still marked dead after `health_check_failures` sweeps.

use std::net::Ipv4Addr;
use std::time::Duration;

use fqdnd_dnsproxy::QueryResult;
use hickory_proto::rr::RecordType;

use crate::harness::{Harness, Mode, advance, ask_udp, eventually, ips, query, udp_client};
use crate::upstream::{Rule, answer};

const REAL: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const TIMEOUT: Duration = Duration::from_millis(400);
/// The sweep period, `TIMEOUT / 8`.
const PERIOD: Duration = Duration::from_millis(50);

async fn start() -> Harness {
    let h = Harness::start(Mode::Done, |c| {
        c.upstream_timeout = TIMEOUT;
        c.health_check_failures = 3;
        // No probe: only the queries' timeouts count.
        c.health_check_interval = Duration::from_secs(3600);
    })
    .await;
    h.upstream.rule(
        "ignored.example.",
        Rule {
            silent: true,
            ..Rule::default()
        },
    );
    h.upstream
        .rule("www.example.", answer("www.example.", [REAL]));
    h
}

/// Sends `n` queries for `ignored.example.` (each from its own socket) and waits until the
/// upstream has them all.
async fn flood(h: &Harness, n: usize) {
    let before = h.upstream.count("ignored.example.", false);
    for _ in 0..n {
        let client = udp_client(Ipv4Addr::LOCALHOST.into()).await;
        let q = query("ignored.example.", RecordType::A, None);
        client.send_to(&q, h.udp).await.unwrap();
    }
    assert!(eventually(|| h.upstream.count("ignored.example.", false) == before + n).await);
}

/// Regression: every timeout found by one sweep counted as a consecutive failure, so ten
/// queries the upstream ignored, sent at once, marked the only upstream dead (and every other
/// query then got SERVFAIL) although it answered everything else.
#[tokio::test(start_paused = true)]
async fn a_burst_of_unanswered_queries_counts_one_failure() {
    let h = start().await;
    flood(&h, 10).await;
    // Sent at one instant of the paused clock: one sweep finds them all expired.
    advance(TIMEOUT + PERIOD).await;
    assert!(eventually(|| h.stats().queries(QueryResult::UpstreamTimeout) == 10).await);
    let stats = h.settled().await;
    assert!(stats.upstreams[0].alive, "{stats:?}");
    assert_eq!(stats.upstreams[0].consecutive_failures, 1);
    // Still in use, and a good answer clears the count.
    let msg = ask_udp(h.udp, "www.example.", RecordType::A).await;
    assert_eq!(ips(&msg), [REAL].into());
    assert_eq!(h.stats().upstreams[0].consecutive_failures, 0);
    assert_eq!(h.stats().queries(QueryResult::NoUpstream), 0);
}

/// Failures spread over `health_check_failures` sweeps with nothing answered in between still
/// mark the upstream dead, at the third.
#[tokio::test(start_paused = true)]
async fn timeouts_found_by_three_sweeps_in_a_row_mark_it_dead() {
    let h = start().await;
    // Three bursts one sweep period apart (at 0, 50 and 100 ms)...
    for burst in 0..3 {
        flood(&h, 2).await;
        if burst < 2 {
            advance(PERIOD).await;
        }
    }
    // ...expire in three successive sweeps (at 400, 450 and 500 ms).
    advance(TIMEOUT - 2 * PERIOD).await;
    for swept in 1..=3 {
        assert!(
            eventually(|| h.stats().queries(QueryResult::UpstreamTimeout) == 2 * swept).await,
            "{:?}",
            h.stats()
        );
        let health = h.stats().upstreams[0].clone();
        assert_eq!(health.consecutive_failures, u32::try_from(swept).unwrap());
        assert_eq!(health.alive, swept < 3, "after sweep {swept}");
        if swept < 3 {
            advance(PERIOD).await;
        }
    }
    // Dead: the next query is not even forwarded.
    let msg = ask_udp(h.udp, "www.example.", RecordType::A).await;
    assert_eq!(
        msg.metadata.response_code,
        hickory_proto::op::ResponseCode::ServFail
    );
    assert_eq!(h.settled().await.queries(QueryResult::NoUpstream), 1);
}
