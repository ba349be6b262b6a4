//! What the HA group's tests share (included by path): a wall clock on tokio's paused clock,
//! a sink that behaves as a gateway's engine would (a shared DNS cache of client groups'
//! names with expiring addresses; client group `refused` is unknown to it), publishers and
//! importers as tasks on the in-memory store.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fqdnd_cluster::learned::{self, Answer, Importer, Publish};
use fqdnd_cluster::{
    Held, Import, Layout, LearnedSink, MemoryStore, Op, Revocation, ShareConfig, ShareStatus,
    Store, Txn, Wall,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Wall clock on tokio's (paused) clock.
pub struct TestWall {
    pub base_ms: u64,
    start: Instant,
}

impl TestWall {
    pub fn new() -> Arc<Self> {
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

/// A gateway's engine as the importer sees it: (client group, name) → address → expiry
/// (Unix ms). Refuses client group `refused`. Revocations forget addresses for every client
/// group (the cache is shared) and the group's record when told.
#[derive(Default)]
pub struct TestSink {
    pub cache: Mutex<BTreeMap<(String, String), BTreeMap<IpAddr, u64>>>,
    pub imports: Mutex<Vec<Import>>,
    pub revocations: Mutex<Vec<Revocation>>,
    pub held_calls: AtomicUsize,
}

impl LearnedSink for TestSink {
    fn import(&self, records: &[Import]) -> usize {
        let mut cache = self.cache.lock().unwrap();
        let mut n = 0;
        for r in records {
            self.imports.lock().unwrap().push(r.clone());
            if r.client == "refused" {
                continue;
            }
            let addrs = cache.entry((r.client.clone(), r.name.clone())).or_default();
            for a in &r.addrs {
                let e = addrs.entry(*a).or_insert(0);
                *e = (*e).max(r.expires_ms);
            }
            n += 1;
        }
        n
    }

    fn revoke(&self, revocations: &[Revocation]) {
        let mut cache = self.cache.lock().unwrap();
        for r in revocations {
            self.revocations.lock().unwrap().push(r.clone());
            for ((_, name), addrs) in cache.iter_mut() {
                if *name == r.name {
                    addrs.retain(|a, _| !r.addrs.contains(a));
                }
            }
            if r.record {
                cache.remove(&(r.client.clone(), r.name.clone()));
            }
            cache.retain(|_, addrs| !addrs.is_empty());
        }
    }

    fn held(&self) -> Vec<Held> {
        self.held_calls.fetch_add(1, Ordering::Relaxed);
        self.cache
            .lock()
            .unwrap()
            .iter()
            .map(|((client, name), addrs)| Held {
                client: client.clone(),
                name: name.clone(),
                addrs: addrs.iter().map(|(a, e)| (*a, *e)).collect(),
            })
            .collect()
    }
}

impl TestSink {
    /// `name@gateway` of every record imported (deduplicated, sorted).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .imports
            .lock()
            .unwrap()
            .iter()
            .map(|r| format!("{}@{}", r.name, r.gateway))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The addresses held for (client, name) that have not expired at `now_ms`.
    pub fn addrs(&self, client: &str, name: &str, now_ms: u64) -> Vec<IpAddr> {
        self.cache
            .lock()
            .unwrap()
            .get(&(client.to_owned(), name.to_owned()))
            .map(|a| {
                a.iter()
                    .filter(|(_, e)| **e > now_ms)
                    .map(|(a, _)| *a)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Holds `addrs` for (client, name) until `expires_ms` (as the gateway's own answer).
    pub fn hold(&self, client: &str, name: &str, addrs: &[IpAddr], expires_ms: u64) {
        let mut cache = self.cache.lock().unwrap();
        let held = cache
            .entry((client.to_owned(), name.to_owned()))
            .or_default();
        for a in addrs {
            held.insert(*a, expires_ms);
        }
    }
}

pub fn config(gateway: &str) -> ShareConfig {
    ShareConfig::new(gateway, "edge", Layout::new("/t"))
}

pub fn ip(last: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, last])
}

pub fn answer(wall: &TestWall, name: &str, last: u8, ttl: u32) -> Answer {
    Answer {
        client: "lan".into(),
        name: name.into(),
        addrs: vec![ip(last)],
        ttl,
        learned_ms: wall.unix_ms(),
    }
}

pub fn learned_keys(store: &MemoryStore) -> Vec<String> {
    store
        .dump()
        .into_keys()
        .filter(|k| k.starts_with("/t-learned/"))
        .collect()
}

/// A publisher task for `gateway` on `store` (stopped when `stop` says so): where to send
/// it answers, and its status.
pub fn spawn_publisher(
    store: &MemoryStore,
    gateway: &str,
    wall: &Arc<TestWall>,
    queue: usize,
    stop: watch::Receiver<bool>,
) -> (mpsc::Sender<Publish>, watch::Receiver<ShareStatus>) {
    spawn_publisher_with(store, config(gateway), wall, queue, stop)
}

pub fn spawn_publisher_with(
    store: &MemoryStore,
    config: ShareConfig,
    wall: &Arc<TestWall>,
    queue: usize,
    stop: watch::Receiver<bool>,
) -> (mpsc::Sender<Publish>, watch::Receiver<ShareStatus>) {
    let (tx, rx) = mpsc::channel(queue);
    let (status, status_rx) = watch::channel(ShareStatus::new("edge"));
    tokio::spawn(learned::publish(
        store.clone(),
        config,
        Arc::clone(wall),
        rx,
        status,
        stop,
    ));
    (tx, status_rx)
}

/// An importer task for `config`'s gateway into `sink` (reading everything first), handing
/// what the group lacks to `publisher`; its status.
pub fn spawn_importer(
    store: &MemoryStore,
    config: ShareConfig,
    sink: &Arc<TestSink>,
    wall: &Arc<TestWall>,
    publisher: mpsc::Sender<Publish>,
    stop: watch::Receiver<bool>,
) -> watch::Receiver<ShareStatus> {
    let (status, status_rx) = watch::channel(ShareStatus::new("edge"));
    let importer = Importer::new(config, Arc::clone(sink), Arc::clone(wall), status);
    tokio::spawn(learned::import(
        store.clone(),
        importer,
        None,
        publisher,
        stop,
    ));
    status_rx
}

/// Writes `value` under `key` (no lease), as anyone with access to etcd could.
pub async fn put(store: &MemoryStore, key: &str, value: impl Into<Vec<u8>>) {
    store
        .txn(Txn {
            compares: Vec::new(),
            ops: vec![Op::Put {
                key: key.to_owned(),
                value: value.into(),
                lease: None,
            }],
        })
        .await
        .unwrap();
}

/// Deletes `key`, as anyone with access to etcd could.
pub async fn delete(store: &MemoryStore, key: &str) {
    store
        .txn(Txn {
            compares: Vec::new(),
            ops: vec![Op::Delete {
                key: key.to_owned(),
            }],
        })
        .await
        .unwrap();
}

/// A record's JSON, as a gateway writes it (`learned_ms + ttl = expires_ms`).
pub fn record(
    gateway: &str,
    client: &str,
    name: &str,
    addrs: &[IpAddr],
    ttl: u32,
    learned_ms: u64,
) -> String {
    serde_json::json!({
        "name": name,
        "client": client,
        "addrs": addrs,
        "ttl": ttl,
        "learned_ms": learned_ms,
        "expires_ms": learned_ms + u64::from(ttl) * 1000,
        "gateway": gateway,
    })
    .to_string()
}

/// Polls `check` on the paused clock (a millisecond a step) until it holds, at most `limit`.
pub async fn until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < end, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Lets the tasks run for `d` of the paused clock.
pub async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}
