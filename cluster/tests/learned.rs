//! The HA gateway group's sharing of learned answers (docs/ha-gateway.md), on the in-memory
//! store and tokio's paused clock: batching (one transaction per batch, never one per answer,
//! at most 128 operations each), keys that expire on their own under expiry-bucket leases and
//! outlive their writer, import of the peers' records (and one's own at start), an outage that
//! keeps what waits and writes it once the store is back, the bound on what waits.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fqdnd_cluster::learned::{self, Answer, Publisher};
use fqdnd_cluster::{
    Layout, LearnedRecord, LearnedSink, MemoryStore, ShareConfig, ShareStatus, Store, Wall,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Wall clock on tokio's (paused) clock.
struct TestWall {
    base_ms: u64,
    start: Instant,
}

impl TestWall {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            base_ms: 1_800_000_001_000,
            start: Instant::now(),
        })
    }
}

impl Wall for TestWall {
    fn unix_ms(&self) -> u64 {
        self.base_ms + u64::try_from(self.start.elapsed().as_millis()).unwrap()
    }
}

/// Records what it is given; refuses client group `refused`.
#[derive(Default)]
struct TestSink {
    got: Mutex<Vec<LearnedRecord>>,
}

impl LearnedSink for TestSink {
    fn import(&self, records: &[LearnedRecord]) -> usize {
        let ok: Vec<_> = records
            .iter()
            .filter(|r| r.client != "refused")
            .cloned()
            .collect();
        let n = ok.len();
        self.got.lock().unwrap().extend(ok);
        n
    }
}

impl TestSink {
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .got
            .lock()
            .unwrap()
            .iter()
            .map(|r| format!("{}@{}", r.name, r.gateway))
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

fn config(gateway: &str) -> ShareConfig {
    ShareConfig::new(gateway, "edge", Layout::new("/t"))
}

fn answer(wall: &TestWall, name: &str, last: u8, ttl: u32) -> Answer {
    Answer {
        client: "lan".into(),
        name: name.into(),
        addrs: vec![IpAddr::from([10, 0, 0, last])],
        ttl,
        learned_ms: wall.unix_ms(),
    }
}

fn learned_keys(store: &MemoryStore) -> Vec<String> {
    store
        .dump()
        .into_keys()
        .filter(|k| k.starts_with("/t-learned/"))
        .collect()
}

/// A publisher task for `gateway` on `store` (stopped when `stop` says so): where to send
/// it answers, and its status.
fn spawn_publisher(
    store: &MemoryStore,
    gateway: &str,
    wall: &Arc<TestWall>,
    queue: usize,
    stop: watch::Receiver<bool>,
) -> (mpsc::Sender<Answer>, watch::Receiver<ShareStatus>) {
    let (tx, rx) = mpsc::channel(queue);
    let (status, status_rx) = watch::channel(ShareStatus::new("edge"));
    tokio::spawn(learned::publish(
        store.clone(),
        config(gateway),
        Arc::clone(wall),
        rx,
        status,
        stop,
    ));
    (tx, status_rx)
}

/// Offers `answers` to `publisher` and writes them at once.
async fn publish_now(
    publisher: &mut Publisher,
    store: &MemoryStore,
    wall: &TestWall,
    answers: Vec<Answer>,
) {
    for answer in answers {
        publisher.offer(answer, Instant::now());
    }
    publisher
        .flush(store, wall.unix_ms(), Instant::now())
        .await
        .unwrap();
}

/// Polls `check` on the paused clock (a millisecond a step) until it holds, at most `limit`.
async fn until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < end, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_answers_is_one_transaction_per_batch() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let (_stop_tx, stop) = watch::channel(false);
    let before = store.revision();
    let (tx, status_rx) = spawn_publisher(&store, "gw-1", &wall, 4096, stop);
    // 300 answers at once (one name asked twice: merged).
    for i in 0..300u32 {
        let last = u8::try_from(i % 250).unwrap();
        tx.send(answer(&wall, &format!("n{i}.example.test"), last, 300))
            .await
            .unwrap();
    }
    tx.send(answer(&wall, "n0.example.test", 251, 300))
        .await
        .unwrap();
    until(Duration::from_secs(1), "300 records written", || {
        status_rx.borrow().published == 300
    })
    .await;
    let s = status_rx.borrow().clone();
    // 300 keys in transactions of at most 128 operations: 3, not 301; one lease grant.
    assert_eq!(s.transactions, 3, "{s:?}");
    assert_eq!(store.revision() - before, 3);
    assert_eq!(learned_keys(&store).len(), 300);
    let value = store.dump()[&config("gw-1").key("lan", "n0.example.test")].clone();
    let record: LearnedRecord = serde_json::from_slice(&value).unwrap();
    assert_eq!(
        record.addrs,
        vec![IpAddr::from([10, 0, 0, 0]), IpAddr::from([10, 0, 0, 251])]
    );
    assert_eq!(record.gateway, "gw-1");
    assert_eq!(record.expires_ms, record.learned_ms + 300_000);
    // The lag is the batch delay (5 ms on the paused clock), not more.
    assert!(s.publish_lag_ms <= 6, "{s:?}");
    // The same answers again: already written, nothing to write.
    let revision = store.revision();
    for i in 0..10u32 {
        let last = u8::try_from(i).unwrap();
        tx.send(answer(&wall, &format!("n{i}.example.test"), last, 300))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.revision(), revision);
}

#[tokio::test(start_paused = true)]
async fn records_expire_on_their_own_after_their_writer_is_gone() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let mut publisher = Publisher::new(config("gw-1"));
    publisher.offer(answer(&wall, "short.example.test", 1, 10), Instant::now());
    publisher.offer(answer(&wall, "long.example.test", 2, 3600), Instant::now());
    let (written, transactions, _) = publisher
        .flush(&store, wall.unix_ms(), Instant::now())
        .await
        .unwrap();
    assert_eq!((written, transactions), (2, 1));
    // Two buckets, two leases; the writer never renews them (it may be dead).
    assert_eq!(store.leases().len(), 2);
    drop(publisher);
    // The short record's lease ends within two 30 s buckets of its expiry; the long one stays.
    store.advance(Duration::from_secs(75));
    let keys = learned_keys(&store);
    assert_eq!(keys, vec![config("gw-1").key("lan", "long.example.test")]);
    store.advance(Duration::from_secs(3600 + 60));
    assert!(learned_keys(&store).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_peer_imports_what_others_learn_and_its_own_only_at_start() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    // What gw-2 wrote before a restart, and gw-1's earlier answer.
    let mut old = Publisher::new(config("gw-2"));
    let before = answer(&wall, "before.example.test", 1, 300);
    publish_now(&mut old, &store, &wall, vec![before]).await;
    let mut gw1 = Publisher::new(config("gw-1"));
    let mut refused = answer(&wall, "refused.example.test", 3, 300);
    refused.client = "refused".into();
    let early = answer(&wall, "early.example.test", 2, 300);
    publish_now(&mut gw1, &store, &wall, vec![early, refused]).await;
    // gw-2 starts: everything is imported before it serves.
    let sink = Arc::new(TestSink::default());
    let (status, status_rx) = watch::channel(ShareStatus::default());
    let revision = learned::import_all(&store, &config("gw-2"), &sink, &wall, &status)
        .await
        .unwrap();
    assert_eq!(
        sink.names(),
        vec!["before.example.test@gw-2", "early.example.test@gw-1"]
    );
    assert_eq!(status_rx.borrow().imported, 2);
    assert_eq!(status_rx.borrow().import_refused, 1);
    // Then it watches: gw-1's new answers come in; gw-2's own do not come back.
    let (_stop_tx, stop) = watch::channel(false);
    tokio::spawn(learned::import(
        store.clone(),
        config("gw-2"),
        Arc::clone(&sink),
        Arc::clone(&wall),
        Some(revision),
        status,
        stop,
    ));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let late = answer(&wall, "late.example.test", 4, 300);
    publish_now(&mut gw1, &store, &wall, vec![late]).await;
    let mut own = Publisher::new(config("gw-2"));
    let mine = answer(&wall, "own.example.test", 5, 300);
    publish_now(&mut own, &store, &wall, vec![mine]).await;
    until(Duration::from_secs(1), "the late answer imported", || {
        sink.names().contains(&"late.example.test@gw-1".to_owned())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!sink.names().contains(&"own.example.test@gw-2".to_owned()));
    assert!(status_rx.borrow().importing);
}

#[tokio::test(start_paused = true)]
async fn an_outage_keeps_what_waits_and_the_importer_catches_up() {
    let store = MemoryStore::new();
    let wall = TestWall::new();
    let (import_status, import_rx) = watch::channel(ShareStatus::default());
    let (_stop_tx, stop) = watch::channel(false);
    let sink = Arc::new(TestSink::default());
    let (tx, status_rx) = spawn_publisher(&store, "gw-1", &wall, 64, stop.clone());
    tokio::spawn(learned::import(
        store.clone(),
        config("gw-2"),
        Arc::clone(&sink),
        Arc::clone(&wall),
        None,
        import_status,
        stop,
    ));
    until(Duration::from_secs(1), "importing", || {
        import_rx.borrow().importing
    })
    .await;
    assert!(
        status_rx.borrow().publishing,
        "nothing written yet is not failing"
    );
    store.set_down(true);
    tx.send(answer(&wall, "during.example.test", 1, 300))
        .await
        .unwrap();
    until(Duration::from_secs(1), "the write failed", || {
        !status_rx.borrow().publishing && status_rx.borrow().last_error.is_some()
    })
    .await;
    assert_eq!(status_rx.borrow().pending, 1);
    assert!(sink.names().is_empty());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(status_rx.borrow().pending, 1, "what waits is kept");
    assert!(!import_rx.borrow().importing);
    store.set_down(false);
    until(Duration::from_secs(5), "written after the outage", || {
        status_rx.borrow().published == 1
    })
    .await;
    until(Duration::from_secs(5), "imported after the outage", || {
        sink.names() == vec!["during.example.test@gw-1".to_owned()]
    })
    .await;
    assert_eq!(status_rx.borrow().pending, 0);
    assert!(status_rx.borrow().publishing);
}

#[tokio::test(start_paused = true)]
async fn what_waits_is_bounded() {
    let wall = TestWall::new();
    let mut c = config("gw-1");
    c.max_pending = 3;
    let mut publisher = Publisher::new(c);
    for i in 0..5 {
        publisher.offer(
            answer(&wall, &format!("n{i}.example.test"), i, 300),
            Instant::now(),
        );
    }
    // A pending key still merges; new keys past the bound are dropped and counted.
    publisher.offer(answer(&wall, "n0.example.test", 9, 300), Instant::now());
    assert_eq!((publisher.pending(), publisher.dropped()), (3, 2));
    // Percent-encoding keeps a key's parts apart.
    assert_eq!(
        config("gw/1").key("a b", "x/y."),
        "/t-learned/edge/gw%2F1/a%20b/x%2Fy."
    );
    // An answer expired before it could be written is not written.
    let store = MemoryStore::new();
    let mut p = Publisher::new(config("gw-1"));
    p.offer(answer(&wall, "gone.example.test", 1, 1), Instant::now());
    let (written, _, _) = p
        .flush(&store, wall.unix_ms() + 5_000, Instant::now())
        .await
        .unwrap();
    assert_eq!(written, 0);
    let _ = store.range("/").await.unwrap();
}
