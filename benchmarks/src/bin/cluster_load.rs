//! The cluster load generator of `benchmarks/cluster.sh`: plays many nodes against a real etcd
//! cluster and the real allocator (`fqdnd operator`), and measures what a real node
//! (`fqdnd gateway` or `fqdnd node` in cluster mode, through its admin socket) sees.
//!
//! Each simulated node holds a lease (renewed every third of its TTL) and publishes its
//! endpoints as a real node does (`<p>/endpoints/<labels>/<node>/<id>`, identity `null` until
//! the global one is known, then again with it). Phases:
//!
//! 1. **fill**: every node publishes its endpoints over a pool of label sets; the allocator
//!    creates one identity per set (identities created/s = sets / time to the last one).
//! 2. **burst**: `--burst` label sets no node had appear at once (one endpoint each): the
//!    allocator's rate (identities created/s) and its temporary → global under a backlog.
//! 3. **churn** for `--seconds`: endpoints replaced at `--churn` per second across random
//!    nodes, a fraction with label sets no node had (`--new-sets` per second). Measured:
//!    temporary → global (a new set's first endpoint committed → its identity seen by the
//!    nodes' watch) and propagation (a churn transaction committed → the real node's view,
//!    `fqdnd status`'s cluster revision, holds it; polled every 10 ms).
//!
//! Then every identity is checked for duplicates. Prints one `key value` line per figure.
//!
//! `cluster_load --etcd URL[,URL…] --node-admin SOCKET[,SOCKET…] [--prefix /fqdnd]
//!  [--nodes 1000] [--endpoints 100] [--sets 2000] [--seconds 30] [--churn 500]
//!  [--new-sets 10] [--ttl 15] [--burst 1000]`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark fixtures are fixed; a failure should stop the run"
)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a benchmark measures wall time, and its poller thread paces itself"
)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fqdnd_cluster::{
    Connect, EndpointRecord, EtcdStore, Event, IdentityRecord, Key, Label, Labels, Layout, LeaseId,
    Op, Revision, Store, Txn, Watch, check_identities,
};
use tokio::sync::Semaphore;

struct Args {
    etcd: Vec<String>,
    admin: Vec<PathBuf>,
    prefix: String,
    nodes: usize,
    endpoints: usize,
    sets: usize,
    seconds: u64,
    churn: usize,
    new_sets: usize,
    ttl: u64,
    burst: usize,
}

fn args() -> Args {
    let mut a = Args {
        etcd: Vec::new(),
        admin: Vec::new(),
        prefix: "/fqdnd".into(),
        nodes: 1000,
        endpoints: 100,
        sets: 2000,
        seconds: 30,
        churn: 500,
        new_sets: 10,
        ttl: 15,
        burst: 1000,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let v = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--etcd" => a.etcd = v.split(',').map(str::to_owned).collect(),
            "--node-admin" => {
                a.admin = v
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            }
            "--prefix" => a.prefix = v,
            "--nodes" => a.nodes = v.parse().unwrap(),
            "--endpoints" => a.endpoints = v.parse().unwrap(),
            "--sets" => a.sets = v.parse().unwrap(),
            "--seconds" => a.seconds = v.parse().unwrap(),
            "--churn" => a.churn = v.parse().unwrap(),
            "--new-sets" => a.new_sets = v.parse().unwrap(),
            "--ttl" => a.ttl = v.parse().unwrap(),
            "--burst" => a.burst = v.parse().unwrap(),
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(!a.etcd.is_empty(), "--etcd is required");
    assert!(a.endpoints <= 200, "at most 200 endpoints per node");
    a
}

fn labels(set: usize) -> Labels {
    Labels::from(vec![
        Label {
            source: "k8s".into(),
            key: "app".into(),
            value: format!("set{set}"),
        },
        Label {
            source: "k8s".into(),
            key: "io.kubernetes.pod.namespace".into(),
            value: "bench".into(),
        },
    ])
}

/// 100.64.0.0/10: node `n`, slot `s` (0..256).
fn ip(node: usize, slot: usize) -> IpAddr {
    let n = (100u32 << 24)
        | (64 << 16)
        | (u32::try_from(node).unwrap() << 8)
        | u32::try_from(slot).unwrap();
    IpAddr::V4(Ipv4Addr::from(n))
}

/// One simulated node.
struct SimNode {
    name: String,
    lease: LeaseId,
    /// Endpoint id → (label set, address slot).
    endpoints: BTreeMap<u16, (usize, usize)>,
    next_id: u16,
}

/// What the measurements share.
#[derive(Default)]
struct Shared {
    /// Global identities seen by the watch.
    identities: HashMap<Labels, u32>,
    /// Label sets waiting for their identity: since when (first endpoint committed).
    waiting: HashMap<Labels, Instant>,
    /// Temporary → global, per new set (ms).
    temp_to_global: Vec<f64>,
    /// Label sets whose identity appeared, for republishing.
    appeared: Vec<Labels>,
    /// Churn transactions: (revision, committed at), waiting for the real node.
    pending: Vec<(Revision, Instant)>,
    /// Propagation to the real node (ms).
    propagation: Vec<f64>,
    /// When the last identity was seen.
    last_identity: Option<Instant>,
}

fn record(node: &str, id: u16, set: usize, addr: IpAddr, identity: Option<u32>) -> Vec<u8> {
    serde_json::to_vec(&EndpointRecord {
        node: node.to_owned(),
        id,
        name: format!("ep{id}"),
        labels: labels(set),
        ips: vec![addr],
        identity,
    })
    .unwrap()
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// `GET /v1/status` over the admin socket; the cluster view's revision.
fn node_revision(socket: &PathBuf) -> Option<i64> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /v1/status HTTP/1.1\r\nHost: fqdnd\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let body = out.split_once("\r\n\r\n")?.1;
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["cluster"]["revision"].as_i64()
}

fn node_status(socket: &PathBuf) -> Option<serde_json::Value> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /v1/status HTTP/1.1\r\nHost: fqdnd\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    serde_json::from_str(out.split_once("\r\n\r\n")?.1).ok()
}

/// Runs `ops` in transactions of at most 100 operations (etcd allows 128); the last revision.
async fn txn(store: &EtcdStore, ops: Vec<Op>) -> Revision {
    let mut last = 0;
    for chunk in ops.chunks(100) {
        last = txn_once(store, chunk.to_vec()).await;
    }
    last
}

async fn txn_once(store: &EtcdStore, ops: Vec<Op>) -> Revision {
    for attempt in 0..20 {
        match store
            .txn(Txn {
                compares: Vec::new(),
                ops: ops.clone(),
            })
            .await
        {
            Ok(outcome) => return outcome.revision,
            Err(e) if attempt < 19 => {
                eprintln!("txn failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("txn failed: {e}"),
        }
    }
    unreachable!()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let layout = Layout::new(&a.prefix);
    let store = EtcdStore::connect(&Connect {
        endpoints: a.etcd.clone(),
        tls: None,
        credentials: None,
        timeout: Duration::from_secs(10),
    })
    .await
    .unwrap();
    let shared = Arc::new(Mutex::new(Shared::default()));

    // The nodes' watch: identities (temporary → global) and what to republish.
    let snapshot = store.range(&layout.root()).await.unwrap();
    let mut w = store
        .watch(&layout.root(), snapshot.revision + 1)
        .await
        .unwrap();
    {
        let shared = Arc::clone(&shared);
        let layout = layout.clone();
        tokio::spawn(async move {
            loop {
                let Ok(batch) = w.next().await else {
                    eprintln!("watch ended");
                    return;
                };
                let now = Instant::now();
                let mut s = shared.lock().unwrap();
                for e in &batch.events {
                    if let Event::Put(kv) = e
                        && let Some(Key::IdentityByLabels(l)) = layout.parse(&kv.key)
                        && let Ok(r) = serde_json::from_slice::<IdentityRecord>(&kv.value)
                    {
                        s.identities.insert(l.clone(), r.id);
                        s.last_identity = Some(now);
                        if let Some(since) = s.waiting.remove(&l) {
                            s.temp_to_global
                                .push(now.duration_since(since).as_secs_f64() * 1000.0);
                        }
                        s.appeared.push(l);
                    }
                }
            }
        });
    }
    // The real nodes' views, polled.
    for socket in a.admin.clone() {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            loop {
                let at = Instant::now();
                if let Some(rev) = node_revision(&socket) {
                    let mut s = shared.lock().unwrap();
                    let mut i = 0;
                    while i < s.pending.len() {
                        if s.pending[i].0 <= rev {
                            let (_, sent) = s.pending.swap_remove(i);
                            s.propagation
                                .push(at.saturating_duration_since(sent).as_secs_f64() * 1000.0);
                        } else {
                            i += 1;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
    }

    // 1. Fill. Every node's lease first, kept alive from then on (a real node renews its
    // lease from the start).
    let ttl = Duration::from_secs(a.ttl);
    let limit = Arc::new(Semaphore::new(16));
    let mut leases = Vec::with_capacity(a.nodes);
    for _ in 0..a.nodes {
        leases.push(store.grant(ttl).await.unwrap());
    }
    {
        let store = store.clone();
        let leases = leases.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                for chunk in leases.chunks(64) {
                    let mut set = tokio::task::JoinSet::new();
                    for lease in chunk {
                        let (store, lease) = (store.clone(), *lease);
                        set.spawn(async move { store.keep_alive(lease).await });
                    }
                    while let Some(alive) = set.join_next().await {
                        if matches!(alive, Ok(Ok(false))) {
                            eprintln!("a simulated node's lease expired");
                        }
                    }
                }
            }
        });
    }
    let started = Instant::now();
    let mut handles = Vec::new();
    for (n, &lease) in leases.iter().enumerate() {
        let store = store.clone();
        let layout = layout.clone();
        let shared = Arc::clone(&shared);
        let limit = Arc::clone(&limit);
        let (endpoints, sets) = (a.endpoints, a.sets);
        handles.push(tokio::spawn(async move {
            let _permit = limit.acquire().await.unwrap();
            let name = format!("sim{n:04}");
            let mut node = SimNode {
                name,
                lease,
                endpoints: BTreeMap::new(),
                next_id: u16::try_from(endpoints).unwrap() + 1,
            };
            let mut ops = Vec::new();
            for e in 0..endpoints {
                let set = (n * endpoints + e) % sets;
                let id = u16::try_from(e + 1).unwrap();
                node.endpoints.insert(id, (set, e));
                ops.push(Op::Put {
                    key: layout.endpoint(&labels(set), &node.name, id),
                    value: record(&node.name, id, set, ip(n, e), None),
                    lease: Some(lease),
                });
            }
            txn(&store, ops).await;
            let now = Instant::now();
            let mut s = shared.lock().unwrap();
            for (set, _) in node.endpoints.values() {
                let l = labels(*set);
                if !s.identities.contains_key(&l) {
                    s.waiting.entry(l).or_insert(now);
                }
            }
            node
        }));
    }
    let mut nodes = Vec::new();
    for h in handles {
        nodes.push(h.await.unwrap());
    }
    let published = started.elapsed();
    println!("fill_published_s {:.2}", published.as_secs_f64());
    // Wait for every set's identity.
    let fill_deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (known, waiting) = {
            let s = shared.lock().unwrap();
            (s.identities.len(), s.waiting.len())
        };
        if known >= a.sets.min(a.nodes * a.endpoints) && waiting == 0 {
            break;
        }
        assert!(
            Instant::now() < fill_deadline,
            "identities never came: {known} known, {waiting} waiting"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fill_time = {
        let s = shared.lock().unwrap();
        s.last_identity
            .unwrap_or_else(Instant::now)
            .duration_since(started)
    };
    let created = a.sets.min(a.nodes * a.endpoints);
    println!("fill_identities {created}");
    println!(
        "fill_identities_per_s {:.0}",
        created as f64 / fill_time.as_secs_f64()
    );
    let mut fill_t2g = std::mem::take(&mut shared.lock().unwrap().temp_to_global);
    println!(
        "fill_temp_to_global_ms p50 {:.0} p99 {:.0} (backlog of {created} sets at once)",
        percentile(&mut fill_t2g, 0.5),
        percentile(&mut fill_t2g, 0.99)
    );
    // Republish with the identities (as real nodes do), and wait for the real node to hold it.
    let by_node: Vec<(usize, Vec<Op>)> = {
        let s = shared.lock().unwrap();
        nodes
            .iter()
            .enumerate()
            .map(|(n, node)| {
                let ops = node
                    .endpoints
                    .iter()
                    .map(|(id, (set, slot))| Op::Put {
                        key: layout.endpoint(&labels(*set), &node.name, *id),
                        value: record(
                            &node.name,
                            *id,
                            *set,
                            ip(n, *slot),
                            s.identities.get(&labels(*set)).copied(),
                        ),
                        lease: Some(node.lease),
                    })
                    .collect();
                (n, ops)
            })
            .collect()
    };
    let mut last = 0;
    let mut set = tokio::task::JoinSet::new();
    for (_, ops) in by_node {
        let store = store.clone();
        let limit = Arc::clone(&limit);
        set.spawn(async move {
            let _permit = limit.acquire().await.unwrap();
            txn(&store, ops).await
        });
    }
    while let Some(r) = set.join_next().await {
        last = last.max(r.unwrap());
    }
    shared.lock().unwrap().appeared.clear();
    let held = Instant::now();
    for socket in &a.admin {
        let deadline = Instant::now() + Duration::from_secs(600);
        while node_revision(socket).unwrap_or(0) < last {
            assert!(Instant::now() < deadline, "the real node never caught up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    println!(
        "fill_real_node_caught_up_s {:.2}",
        held.elapsed().as_secs_f64()
    );
    for socket in &a.admin {
        if let Some(s) = node_status(socket) {
            println!(
                "real_node_remote_endpoints {}",
                s["cluster"]["remote_endpoints"].as_u64().unwrap_or(0)
            );
        }
    }
    shared.lock().unwrap().propagation.clear();

    // 1b. Burst: `--burst` label sets no node had, one endpoint each on every tenth node,
    // published at once: the allocator's own rate.
    let mut next_set = a.sets;
    if a.burst > 0 {
        let mut by_node: BTreeMap<usize, Vec<Op>> = BTreeMap::new();
        let mut burst_sets = Vec::new();
        for b in 0..a.burst {
            next_set += 1;
            let n = (b * 10) % nodes.len();
            let node = &mut nodes[n];
            let id = node.next_id;
            node.next_id += 1;
            let slot = 200 + b % 50;
            node.endpoints.insert(id, (next_set, slot));
            burst_sets.push(labels(next_set));
            by_node.entry(n).or_default().push(Op::Put {
                key: layout.endpoint(&labels(next_set), &node.name, id),
                value: record(&node.name, id, next_set, ip(n, slot), None),
                lease: Some(node.lease),
            });
        }
        let burst_start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for (_, ops) in by_node {
            let store = store.clone();
            let shared = Arc::clone(&shared);
            set.spawn(async move {
                txn(&store, ops).await;
            });
            drop(shared);
        }
        while set.join_next().await.is_some() {}
        {
            let now = Instant::now();
            let mut s = shared.lock().unwrap();
            for l in &burst_sets {
                if !s.identities.contains_key(l) {
                    s.waiting.entry(l.clone()).or_insert(now);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let done = {
                let s = shared.lock().unwrap();
                burst_sets.iter().all(|l| s.identities.contains_key(l))
            };
            if done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the burst's identities never came"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let elapsed = {
            let s = shared.lock().unwrap();
            s.last_identity
                .unwrap_or_else(Instant::now)
                .duration_since(burst_start)
        };
        let mut t2g = std::mem::take(&mut shared.lock().unwrap().temp_to_global);
        println!(
            "burst_identities {} in {:.2} s: identities_created_per_s {:.0} (temp_to_global p50 {:.0} ms p99 {:.0} ms)",
            a.burst,
            elapsed.as_secs_f64(),
            a.burst as f64 / elapsed.as_secs_f64(),
            percentile(&mut t2g, 0.5),
            percentile(&mut t2g, 0.99)
        );
        shared.lock().unwrap().appeared.clear();
    }

    // 2. Churn.
    let tick = Duration::from_millis(100);
    let per_tick = (a.churn / 10).max(1);
    let new_every = a
        .churn
        .checked_div(a.new_sets)
        .map_or(usize::MAX, |n| n.max(1));
    let first_new_set = next_set;
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rand = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        usize::try_from(rng % n as u64).unwrap()
    };
    let churn_start = Instant::now();
    let mut replaced = 0usize;
    let mut interval = tokio::time::interval(tick);
    let mut writes = tokio::task::JoinSet::new();
    while churn_start.elapsed() < Duration::from_secs(a.seconds) {
        interval.tick().await;
        // Group this tick's replacements by node: one transaction per node, one operation
        // per key (the last wins: etcd refuses a key twice in one transaction).
        let mut changes: BTreeMap<usize, BTreeMap<String, Op>> = BTreeMap::new();
        // New label sets, with the node whose transaction carries their endpoint.
        let mut new_sets: BTreeMap<usize, Vec<Labels>> = BTreeMap::new();
        let identities = shared.lock().unwrap().identities.clone();
        for _ in 0..per_tick {
            let n = rand(nodes.len());
            let node = &mut nodes[n];
            let Some((&old_id, &(old_set, slot))) =
                node.endpoints.iter().nth(rand(node.endpoints.len()))
            else {
                continue;
            };
            node.endpoints.remove(&old_id);
            let set = if replaced % new_every == new_every - 1 {
                next_set += 1;
                new_sets.entry(n).or_default().push(labels(next_set));
                next_set
            } else {
                rand(a.sets)
            };
            replaced += 1;
            let id = node.next_id;
            node.next_id = if node.next_id >= 60_000 {
                u16::try_from(a.endpoints).unwrap() + 1
            } else {
                node.next_id + 1
            };
            node.endpoints.insert(id, (set, slot));
            let ops = changes.entry(n).or_default();
            let old_key = layout.endpoint(&labels(old_set), &node.name, old_id);
            ops.insert(old_key.clone(), Op::Delete { key: old_key });
            let key = layout.endpoint(&labels(set), &node.name, id);
            ops.insert(
                key.clone(),
                Op::Put {
                    key,
                    value: record(
                        &node.name,
                        id,
                        set,
                        ip(n, slot),
                        identities.get(&labels(set)).copied(),
                    ),
                    lease: Some(node.lease),
                },
            );
        }
        // Republish endpoints whose set just got its identity.
        let appeared: HashSet<Labels> = shared.lock().unwrap().appeared.drain(..).collect();
        if !appeared.is_empty() {
            let identities = shared.lock().unwrap().identities.clone();
            for (n, node) in nodes.iter().enumerate() {
                for (id, (set, slot)) in &node.endpoints {
                    let l = labels(*set);
                    if appeared.contains(&l) {
                        let key = layout.endpoint(&l, &node.name, *id);
                        changes.entry(n).or_default().insert(
                            key.clone(),
                            Op::Put {
                                key,
                                value: record(
                                    &node.name,
                                    *id,
                                    *set,
                                    ip(n, *slot),
                                    identities.get(&l).copied(),
                                ),
                                lease: Some(node.lease),
                            },
                        );
                    }
                }
            }
        }
        for (n, ops) in changes {
            let ops: Vec<Op> = ops.into_values().collect();
            let store = store.clone();
            let shared = Arc::clone(&shared);
            let limit = Arc::clone(&limit);
            let new_sets = new_sets.remove(&n).unwrap_or_default();
            writes.spawn(async move {
                let _permit = limit.acquire().await.unwrap();
                let rev = txn(&store, ops).await;
                let now = Instant::now();
                let mut s = shared.lock().unwrap();
                s.pending.push((rev, now));
                for l in new_sets {
                    if !s.identities.contains_key(&l) {
                        s.waiting.entry(l).or_insert(now);
                    }
                }
            });
        }
        // The nodes' writes of this tick finish before the next tick: the achieved rate is
        // what etcd (and this machine) sustain, and nothing queues unmeasured.
        while writes.join_next().await.is_some() {}
    }
    while writes.join_next().await.is_some() {}
    // Let the last changes arrive.
    let drain = Instant::now() + Duration::from_secs(30);
    while Instant::now() < drain {
        let done = {
            let s = shared.lock().unwrap();
            s.pending.is_empty() && s.waiting.is_empty()
        };
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let churn_secs = churn_start.elapsed().as_secs_f64();
    let (mut t2g, mut prop, left_pending, left_waiting) = {
        let mut s = shared.lock().unwrap();
        (
            std::mem::take(&mut s.temp_to_global),
            std::mem::take(&mut s.propagation),
            s.pending.len(),
            s.waiting.len(),
        )
    };
    println!(
        "churn_replacements {replaced} in {churn_secs:.1} s ({:.0}/s)",
        replaced as f64 / churn_secs
    );
    println!(
        "churn_new_sets {} (unresolved {left_waiting})",
        next_set - first_new_set
    );
    let (t2g50, t2g99) = (percentile(&mut t2g, 0.5), percentile(&mut t2g, 0.99));
    let (p50, p99) = (percentile(&mut prop, 0.5), percentile(&mut prop, 0.99));
    println!(
        "temp_to_global_ms p50 {t2g50:.0} p99 {t2g99:.0} ({} sets)",
        t2g.len()
    );
    println!(
        "propagation_ms p50 {p50:.0} p99 {p99:.0} ({} transactions, {left_pending} unseen)",
        prop.len()
    );

    // 3. Duplicates.
    let snapshot = store.range(&layout.identities()).await.unwrap();
    let duplicates = match check_identities(&layout, &snapshot.kvs) {
        Ok(table) => {
            println!("identities_total {}", table.len());
            0
        }
        Err(e) => {
            println!("identity_check_failed {e}");
            1
        }
    };
    let endpoints = nodes.iter().map(|n| n.endpoints.len()).sum::<usize>();
    println!(
        "cluster: nodes {}, endpoints {endpoints}, duplicate identities: {duplicates}, temp-to-global p99 ms: {t2g99:.0}, propagation p99 ms: {p99:.0}",
        nodes.len()
    );
}
