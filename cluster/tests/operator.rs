//! The allocator service and the node side on the in-memory store, on tokio's paused clock
//! (the store's leases expire only when the test moves the store's clock).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fqdnd_cluster::node::{self, Local, LocalEndpoint, NodeConfig, NodeStatus, Sink};
use fqdnd_cluster::operator::{self, OperatorConfig, OperatorStatus};
use fqdnd_cluster::{
    Changes, EndpointRecord, Label, Labels, Layout, MemoryStore, NodeRecord, Op, Store, Txn, View,
    check_identities,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(5);

fn labels(app: &str) -> Labels {
    Labels::from(vec![Label {
        source: "k8s".into(),
        key: "app".into(),
        value: app.into(),
    }])
}

/// Polls `check` on tokio's (paused) clock — the store's clock moving along — for at most 10
/// virtual minutes.
async fn until(store: &MemoryStore, what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..30_000 {
        if check() {
            return;
        }
        store.advance(Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never happened: {what}");
}

/// Moves the store's clock by `by` in steps, letting live instances renew their leases.
async fn pass(store: &MemoryStore, by: Duration) {
    let step = Duration::from_millis(250);
    let mut left = by;
    while !left.is_zero() {
        let d = left.min(step);
        store.advance(d);
        tokio::time::sleep(d).await;
        left -= d;
    }
}

struct Instance {
    status: watch::Receiver<OperatorStatus>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn start_operator(store: &MemoryStore, name: &str) -> Instance {
    let mut config = OperatorConfig::new(name.to_owned(), Layout::new("/t"));
    config.lease_ttl = TTL;
    config.gc_grace = Duration::from_secs(30);
    config.gc_interval = Duration::from_secs(1);
    let (status_tx, status) = watch::channel(OperatorStatus::default());
    let (stop, stop_rx) = watch::channel(false);
    let store = store.clone();
    let task = tokio::spawn(async move {
        operator::run(store, config, status_tx, stop_rx)
            .await
            .unwrap();
    });
    Instance { status, stop, task }
}

async fn identities(store: &MemoryStore) -> BTreeMap<u32, Labels> {
    let layout = Layout::new("/t");
    let snapshot = store.range(&layout.root()).await.unwrap();
    check_identities(&layout, &snapshot.kvs).unwrap()
}

async fn register(store: &MemoryStore, set: &str, nodes: &[&str]) {
    let layout = Layout::new("/t");
    // One transaction: every node's endpoint appears at the same revision.
    store
        .txn(Txn {
            compares: vec![],
            ops: nodes
                .iter()
                .map(|n| Op::Put {
                    key: layout.endpoint(&labels(set), n, 1),
                    value: EndpointRecord::new(n, 1, labels(set)).to_value(),
                    lease: None,
                })
                .collect(),
        })
        .await
        .unwrap();
}

fn number_of(table: &BTreeMap<u32, Labels>, set: &str) -> Option<u32> {
    table
        .iter()
        .find(|(_, l)| **l == labels(set))
        .map(|(id, _)| *id)
}

#[tokio::test(start_paused = true)]
async fn one_leader_allocates_a_dead_leader_is_replaced_and_numbers_stay() {
    let store = MemoryStore::new();
    let mut instances: Vec<Instance> = ["op-a", "op-b", "op-c"]
        .iter()
        .map(|n| start_operator(&store, n))
        .collect();
    let leading = |instances: &[Instance]| {
        instances
            .iter()
            .filter(|i| i.status.borrow().leading)
            .count()
    };
    until(&store, "one leader", || leading(&instances) == 1).await;
    register(&store, "web", &["n1", "n2", "n3"]).await;
    register(&store, "db", &["n1", "n2"]).await;
    let mut table = BTreeMap::new();
    for _ in 0..3000 {
        table = identities(&store).await;
        if table.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(table.len(), 2, "one identity per label set: {table:?}");
    // Kill the leader without resigning: its lease must expire before another leads.
    let dead = instances
        .iter()
        .position(|i| i.status.borrow().leading)
        .unwrap();
    let victim = instances.remove(dead);
    victim.task.abort();
    let _ = victim.task.await;
    pass(&store, Duration::from_secs(2)).await;
    assert_eq!(
        leading(&instances),
        0,
        "the dead leader's lease still holds the key"
    );
    pass(&store, TTL).await;
    until(&store, "a new leader", || leading(&instances) == 1).await;
    register(&store, "cache", &["n3"]).await;
    let mut after = BTreeMap::new();
    for _ in 0..3000 {
        after = identities(&store).await;
        if after.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(after.len(), 3);
    for set in ["web", "db"] {
        assert_eq!(
            number_of(&after, set),
            number_of(&table, set),
            "{set} kept its number"
        );
    }
    // A stopping leader resigns: the key goes at once.
    for i in &instances {
        let _ = i.stop.send(true);
    }
    for i in instances {
        i.task.await.unwrap();
    }
    let layout = Layout::new("/t");
    assert!(store.range(&layout.leader()).await.unwrap().kvs.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_identity_unused_for_the_grace_is_collected_and_comes_back_when_used() {
    let store = MemoryStore::new();
    let op = start_operator(&store, "op-a");
    register(&store, "job", &["n1"]).await;
    let mut table = BTreeMap::new();
    for _ in 0..3000 {
        table = identities(&store).await;
        if !table.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = number_of(&table, "job").unwrap();
    let layout = Layout::new("/t");
    store
        .txn(Txn {
            compares: vec![],
            ops: vec![Op::Delete {
                key: layout.endpoint(&labels("job"), "n1", 1),
            }],
        })
        .await
        .unwrap();
    // Within the grace (30 s) it stays.
    for _ in 0..20 {
        pass(&store, Duration::from_secs(1)).await;
        assert_eq!(number_of(&identities(&store).await, "job"), Some(first));
    }
    let mut gone = false;
    for _ in 0..60 {
        pass(&store, Duration::from_secs(1)).await;
        if identities(&store).await.is_empty() {
            gone = true;
            break;
        }
    }
    assert!(gone, "collected after the grace");
    assert_eq!(op.status.borrow().collected, 1);
    register(&store, "job", &["n2"]).await;
    let mut again = None;
    for _ in 0..3000 {
        again = number_of(&identities(&store).await, "job");
        if again.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(
        again,
        Some(first),
        "next-fit: a freed number is not reused at once"
    );
}

/// A sink that keeps the last view and every change.
#[derive(Default)]
struct Recorder {
    last: Mutex<View>,
    changes: Mutex<Vec<Changes>>,
}

impl Sink for Recorder {
    fn apply(&self, changes: &Changes) {
        self.last.lock().unwrap().absorb(changes);
        self.changes.lock().unwrap().push(changes.clone());
    }
}

struct Node {
    sink: Arc<Recorder>,
    local: watch::Sender<Local>,
    status: watch::Receiver<NodeStatus>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn start_node(
    store: &MemoryStore,
    name: &str,
    view: View,
    state: Option<std::path::PathBuf>,
) -> Node {
    let config = NodeConfig {
        node: name.to_owned(),
        layout: Layout::new("/t"),
        lease_ttl: TTL,
        state_file: state,
    };
    let sink = Arc::new(Recorder::default());
    let (local, local_rx) = watch::channel(Local::default());
    let (status_tx, status) = watch::channel(NodeStatus::default());
    let (stop, stop_rx) = watch::channel(false);
    let store = store.clone();
    let s = Arc::clone(&sink);
    let task = tokio::spawn(async move {
        node::run(store, config, view, s, local_rx, status_tx, stop_rx)
            .await
            .unwrap();
    });
    Node {
        sink,
        local,
        status,
        stop,
        task,
    }
}

/// The node's endpoints, without addresses of its own.
fn endpoints(endpoints: Vec<LocalEndpoint>) -> Local {
    Local {
        endpoints,
        addresses: Vec::new(),
    }
}

fn endpoint(id: u16, app: &str, ip: &str) -> LocalEndpoint {
    LocalEndpoint {
        id,
        name: format!("{app}-{id}"),
        labels: labels(app),
        ips: vec![ip.parse().unwrap()],
    }
}

#[tokio::test(start_paused = true)]
async fn nodes_publish_learn_each_others_endpoints_survive_an_outage_and_a_lost_lease() {
    let store = MemoryStore::new();
    let dir = tempfile::tempdir().unwrap();
    let state_a = dir.path().join("a.state");
    let a = start_node(&store, "a", View::default(), Some(state_a.clone()));
    let b = start_node(&store, "b", View::default(), None);
    a.local
        .send_replace(endpoints(vec![endpoint(1, "web", "10.0.0.1")]));
    until(&store, "a published", || a.status.borrow().published == 1).await;
    // No allocator yet: b sees a's endpoint without a global identity.
    until(&store, "b sees a's endpoint", || {
        b.sink.last.lock().unwrap().endpoints.len() == 1
    })
    .await;
    assert!(
        b.sink
            .last
            .lock()
            .unwrap()
            .endpoints
            .values()
            .all(|e| e.identity.is_none()),
        "a temporary identity never leaves its node"
    );
    let op = start_operator(&store, "op");
    until(
        &store,
        "the identity reaches b, and a's record carries it",
        || {
            let view = b.sink.last.lock().unwrap();
            let id = view.identities.get(&labels("web")).copied();
            id.is_some() && view.endpoints.values().all(|e| e.identity == id)
        },
    )
    .await;
    // An outage: nothing is lost, a's new endpoint waits, everything resyncs after.
    store.set_down(true);
    until(&store, "a notices", || !a.status.borrow().connected).await;
    // Once it says so, its view is on disk (a restart from here on starts from it).
    let saved = View::load(&state_a).unwrap().unwrap();
    assert_eq!(
        saved.identities.get(&labels("web")),
        b.sink.last.lock().unwrap().identities.get(&labels("web"))
    );
    a.local.send_replace(endpoints(vec![
        endpoint(1, "web", "10.0.0.1"),
        endpoint(2, "api", "10.0.0.2"),
    ]));
    pass(&store, Duration::from_secs(30)).await;
    assert_eq!(
        b.sink.last.lock().unwrap().endpoints.len(),
        1,
        "b keeps what it knew"
    );
    let changes_before = b.sink.changes.lock().unwrap().len();
    store.set_down(false);
    until(
        &store,
        "a's second endpoint reaches b with its identity",
        || {
            let view = b.sink.last.lock().unwrap();
            view.endpoints.len() == 2 && view.endpoints.values().all(|e| e.identity.is_some())
        },
    )
    .await;
    // b's resync handed over only what changed: never a removal of what it knew.
    for c in &b.sink.changes.lock().unwrap()[changes_before..] {
        assert!(
            c.endpoints_removed.is_empty() && c.unassigned.is_empty(),
            "{c:?}"
        );
    }
    // a's lease is revoked behind its back (as if it expired): b sees the endpoints go, a
    // notices at its next renewal and publishes again under a new lease.
    let layout = Layout::new("/t");
    let lease = store.range(&layout.endpoints()).await.unwrap().kvs[0].lease;
    assert!(store.leases().contains(&lease));
    store.revoke(lease).await.unwrap();
    // (b may see them go and come back, or — both within one of its batches — nothing.)
    for _ in 0..3000 {
        let kvs = store.range(&layout.endpoints()).await.unwrap().kvs;
        if kvs.len() == 2 && kvs.iter().all(|kv| kv.lease != lease) {
            break;
        }
        pass(&store, Duration::from_millis(20)).await;
    }
    let kvs = store.range(&layout.endpoints()).await.unwrap().kvs;
    assert!(
        kvs.len() == 2 && kvs.iter().all(|kv| kv.lease != lease),
        "republished under a new lease"
    );
    until(&store, "b has them", || {
        b.sink.last.lock().unwrap().endpoints.len() == 2
    })
    .await;
    assert_eq!(a.status.borrow().published, 2);
    for n in [&a, &b] {
        let _ = n.stop.send(true);
    }
    let _ = op.stop.send(true);
    a.task.await.unwrap();
    b.task.await.unwrap();
    op.task.await.unwrap();
    drop(layout);
    // A node restarted from its state file starts where it was: its first sync changes
    // nothing it had.
    let saved = View::load(&state_a).unwrap().unwrap();
    assert_eq!(saved.identities.len(), 2);
    let a2 = start_node(&store, "a", saved.clone(), Some(state_a));
    until(&store, "a2 in sync", || a2.status.borrow().connected).await;
    for c in a2.sink.changes.lock().unwrap().iter() {
        assert!(
            c.unassigned.is_empty() && c.endpoints_removed.is_empty(),
            "{c:?}"
        );
    }
    let _ = a2.stop.send(true);
    a2.task.await.unwrap();
}

/// Each node registers under its lease with its own addresses: the others learn them, a
/// change of the set reaches them, the same set again writes nothing, and when the node is
/// gone (its lease expired) the others see its registration go.
#[tokio::test(start_paused = true)]
async fn nodes_register_their_addresses_and_the_registration_goes_with_the_lease() {
    let store = MemoryStore::new();
    let layout = Layout::new("/t");
    let a = start_node(&store, "a", View::default(), None);
    let b = start_node(&store, "b", View::default(), None);
    let addr = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    a.local.send_replace(Local {
        endpoints: vec![endpoint(1, "web", "10.0.0.1")],
        addresses: vec![addr("192.0.2.2"), addr("192.0.2.1")],
    });
    until(&store, "b knows a's addresses", || {
        b.sink.last.lock().unwrap().nodes.get("a")
            == Some(&NodeRecord {
                node: "a".into(),
                ips: vec![addr("192.0.2.1"), addr("192.0.2.2")],
            })
    })
    .await;
    // a knows b's registration (no addresses), never its own; the registration is not an
    // endpoint.
    until(&store, "a knows b", || {
        a.sink.last.lock().unwrap().nodes.contains_key("b")
    })
    .await;
    assert!(!b.sink.last.lock().unwrap().nodes.contains_key("b"));
    assert_eq!(a.status.borrow().published, 1);
    assert_eq!(b.status.borrow().remote_nodes, 1);
    // The same set again (the daemon reads the addresses every second): nothing is written.
    let key = layout.node("a");
    let revision = |kvs: Vec<fqdnd_cluster::Kv>| {
        kvs.iter()
            .find(|kv| kv.key == key)
            .map(|kv| kv.mod_revision)
    };
    let before = revision(store.range(&layout.nodes()).await.unwrap().kvs);
    a.local.send_replace(Local {
        endpoints: vec![endpoint(1, "web", "10.0.0.1")],
        addresses: vec![addr("192.0.2.1"), addr("192.0.2.2")],
    });
    pass(&store, Duration::from_secs(3)).await;
    assert_eq!(
        revision(store.range(&layout.nodes()).await.unwrap().kvs),
        before
    );
    // Another set: b gets the change.
    a.local.send_replace(Local {
        endpoints: vec![endpoint(1, "web", "10.0.0.1")],
        addresses: vec![addr("192.0.2.3")],
    });
    until(&store, "b sees a's new addresses", || {
        b.sink
            .last
            .lock()
            .unwrap()
            .nodes
            .get("a")
            .map(|r| r.ips.clone())
            == Some(vec![addr("192.0.2.3")])
    })
    .await;
    // a stops (its lease is left to expire): b sees its registration and endpoint go.
    let _ = a.stop.send(true);
    a.task.await.unwrap();
    until(&store, "a's registration expired at b", || {
        let view = b.sink.last.lock().unwrap();
        !view.nodes.contains_key("a") && view.endpoints.is_empty()
    })
    .await;
    assert!(
        b.sink
            .changes
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.nodes_removed == vec!["a".to_owned()])
    );
    let _ = b.stop.send(true);
    b.task.await.unwrap();
}
