//! The exported metrics: names, labels, and that a query moves them. The proxy takes its
//! metric handles in `bind`, so a thread-local recorder installed around `bind` sees
//! everything without touching the process-wide one.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fqdnd_dnsproxy::metrics as m;
use hickory_proto::rr::RecordType;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use crate::harness::{Harness, Mode, ask_udp, eventually};
use crate::upstream::{Fault, Rule, answer};

/// Keeps every registered metric under `name{label=value,…}`.
#[derive(Default)]
struct TestRecorder {
    described: Mutex<Vec<String>>,
    counters: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
}

fn render(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.described.lock().unwrap().push(key.as_str().to_owned());
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(
            self.counters
                .lock()
                .unwrap()
                .entry(render(key))
                .or_default()
                .clone(),
        )
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(
            self.gauges
                .lock()
                .unwrap()
                .entry(render(key))
                .or_default()
                .clone(),
        )
    }
    /// The proxy records no histogram through the facade (its latency summaries are its own).
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        panic!("{}: a histogram through the facade", render(key))
    }
}

impl TestRecorder {
    fn counter(&self, key: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(key)
            .map_or(u64::MAX, |c| c.load(Ordering::SeqCst))
    }
    fn gauge(&self, key: &str) -> f64 {
        self.gauges
            .lock()
            .unwrap()
            .get(key)
            .map_or(f64::NAN, |g| f64::from_bits(g.load(Ordering::SeqCst)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_move_the_described_metrics() {
    let recorder = TestRecorder::default();
    let h = {
        let _guard = metrics::set_default_local_recorder(&recorder);
        m::describe_metrics();
        Harness::start(Mode::Done, |_| {}).await
    };
    for name in [
        m::QUERIES,
        m::DROPPED_ANSWERS,
        m::DROPPED_QUERIES,
        m::CONCURRENCY_LIMITED,
        m::INFLIGHT,
        m::UPSTREAM_UP,
        m::HOLD_FALLBACKS,
        m::TCP_REFUSED,
        m::RAW_REPLIES,
        m::RAW_REPLY_ERRORS,
        m::ORIGINAL_DESTINATION_OVERFLOW,
        m::ORIGINAL_DESTINATIONS,
        m::UPSTREAM_SOCKET_ROTATIONS,
        m::UPSTREAM_SOCKET_ROTATION_FAILURES,
    ] {
        assert!(
            recorder.described.lock().unwrap().iter().any(|d| d == name),
            "{name} described"
        );
    }
    // The latency summaries are described where the proxy renders them, not to the recorder.
    for name in [m::UPSTREAM_LATENCY, m::HOLD, m::OBSERVER] {
        assert!(
            !recorder.described.lock().unwrap().iter().any(|d| d == name),
            "{name} described to the facade"
        );
    }
    let ip = Ipv4Addr::new(192, 0, 2, 1);
    h.upstream.rule(
        "www.example.",
        Rule {
            faults: vec![Fault::WrongId],
            ..answer("www.example.", [ip])
        },
    );
    ask_udp(h.udp, "www.example.", RecordType::A).await;
    ask_udp(h.udp, "denied.example.", RecordType::A).await;
    h.settled().await;

    assert_eq!(
        recorder.counter("fqdnd_dns_queries_total{result=answered}"),
        1
    );
    assert_eq!(
        recorder.counter("fqdnd_dns_queries_total{result=denied}"),
        1
    );
    assert_eq!(
        recorder.counter("fqdnd_dns_queries_total{result=upstream_timeout}"),
        0
    );
    assert_eq!(
        recorder.counter("fqdnd_dns_dropped_answers_total{reason=unknown_id}"),
        1
    );
    assert_eq!(recorder.counter("fqdnd_dns_concurrency_limited_total"), 0);
    assert_eq!(
        recorder.counter("fqdnd_dns_dropped_queries_total{reason=runt}"),
        0,
        "registered at bind"
    );
    for reason in ["max_connections", "fd_exhausted"] {
        let key = format!("fqdnd_dns_tcp_connections_refused_total{{reason={reason}}}");
        assert_eq!(recorder.counter(&key), 0, "{key} registered at bind");
    }
    assert_eq!(
        recorder.counter("fqdnd_dns_dropped_answers_total{reason=case_mismatch}"),
        0
    );
    assert_eq!(
        recorder.counter("fqdnd_dns_upstream_socket_rotations_total"),
        0
    );
    // Registered at bind even when the transparent mode is off.
    assert_eq!(recorder.counter("fqdnd_dns_raw_replies_total"), 0);
    assert_eq!(recorder.counter("fqdnd_dns_raw_reply_errors_total"), 0);
    assert_eq!(
        recorder.counter("fqdnd_dns_original_destination_overflow_total"),
        0
    );
    // The latency summaries are the proxy's own (rendered by `render_summaries`).
    assert_eq!(h.stats().latency_samples, [1, 1, 1]);
    let mut page = String::new();
    m::render_summaries(&mut page);
    for name in [m::UPSTREAM_LATENCY, m::HOLD, m::OBSERVER] {
        assert!(page.contains(&format!("# TYPE {name} summary")), "{page}");
        assert!(
            page.contains(&format!("{name}{{quantile=\"0.99\"}} ")),
            "{page}"
        );
    }
    let up = format!("fqdnd_dns_upstream_up{{upstream={}}}", h.upstream.addr);
    assert!((recorder.gauge(&up) - 1.0).abs() < f64::EPSILON);
    // The sweep samples the in-flight gauge.
    assert!(eventually(|| recorder.gauge(m::INFLIGHT) == 0.0).await);
}
