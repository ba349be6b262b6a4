//! A hostile store: whatever is written under the cluster's prefix — garbage, binary,
//! oversized values, numbers out of range, keys and values that disagree, forged records,
//! keys outside the layout — a node never applies more than the valid records, the allocator
//! keeps allocating, every refusal is counted by kind, and the log stays bounded (one line per
//! bad key, not one per read). On the in-memory store, on tokio's paused clock.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fqdnd_cluster::node::{self, Local, LocalEndpoint, NodeConfig, NodeStatus, Sink};
use fqdnd_cluster::operator::{self, OperatorConfig, OperatorStatus};
use fqdnd_cluster::{
    Changes, EndpointRecord, IdentityRecord, Label, Labels, Layout, MemoryStore, NodeRecord, Op,
    RecordKind, Store, Txn, View,
};
use tokio::sync::watch;
use tracing_subscriber::layer::SubscriberExt;

const TTL: Duration = Duration::from_secs(5);

fn labels(app: &str) -> Labels {
    Labels::from(vec![Label {
        source: "k8s".into(),
        key: "app".into(),
        value: app.into(),
    }])
}

/// Counts the warnings and errors logged.
#[derive(Clone, Default)]
struct Lines(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Lines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() <= tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

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

async fn put(store: &MemoryStore, key: String, value: Vec<u8>) {
    store
        .txn(Txn {
            compares: vec![],
            ops: vec![Op::Put {
                key,
                value,
                lease: None,
            }],
        })
        .await
        .unwrap();
}

fn identity(id: u32, app: &str) -> Vec<u8> {
    serde_json::to_vec(&IdentityRecord {
        id,
        labels: labels(app),
    })
    .unwrap()
}

#[derive(Default)]
struct Recorder {
    last: Mutex<View>,
}

impl Sink for Recorder {
    fn apply(&self, changes: &Changes) {
        self.last.lock().unwrap().absorb(changes);
    }
}

async fn numbers(store: &MemoryStore, layout: &Layout) -> BTreeMap<Labels, u32> {
    let snapshot = store.range(&layout.identities()).await.unwrap();
    snapshot
        .kvs
        .iter()
        .filter(|kv| {
            kv.key
                .starts_with(&format!("{}/identities/labels/", layout.prefix()))
        })
        .filter_map(|kv| serde_json::from_slice::<IdentityRecord>(&kv.value).ok())
        .map(|r| (r.labels, r.id))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn garbage_under_every_key_family_is_refused_alone_and_allocation_goes_on() {
    let lines = Lines::default();
    let _log = tracing::subscriber::set_default(tracing_subscriber::registry().with(lines.clone()));
    let store = MemoryStore::new();
    let layout = Layout::new("/t");
    let oversized = vec![b'x'; 1 << 20];
    // Before anything runs: a damaged key at the allocator's first number (item: one bad key
    // froze allocation), a forged record for a label set nobody uses, a label set's key
    // naming a number out of range, garbage everywhere else.
    put(
        &store,
        layout.identity_by_id(256),
        b"this: [is not".to_vec(),
    )
    .await;
    put(&store, layout.identity_by_id(257), identity(258, "forged")).await;
    put(
        &store,
        layout.identity_by_labels(&labels("api")),
        identity(70_000, "api"),
    )
    .await;
    put(
        &store,
        layout.identity_by_labels(&labels("db")),
        vec![0xff, 0, 0xfe],
    )
    .await;
    put(
        &store,
        layout.identity_by_labels(&labels("evil")),
        identity(259, "web"),
    )
    .await;
    put(
        &store,
        layout.endpoint(&labels("ghost"), "x", 1),
        b"{}".to_vec(),
    )
    .await;
    put(
        &store,
        layout.endpoint(&labels("ghost"), "y", 1),
        oversized.clone(),
    )
    .await;
    let mut lying = EndpointRecord::new("z", 2, labels("ghost2"));
    lying.ips = vec!["10.9.9.9".parse().unwrap()];
    put(
        &store,
        layout.endpoint(&labels("ghost2"), "z", 1),
        lying.to_value(),
    )
    .await;
    put(&store, layout.node("n9"), oversized).await;
    put(
        &store,
        layout.node("n8"),
        serde_json::to_vec(&NodeRecord {
            node: "n7".into(),
            ips: vec!["192.0.2.7".parse().unwrap()],
        })
        .unwrap(),
    )
    .await;
    put(
        &store,
        "/t/identities/id/99999".into(),
        identity(300, "web"),
    )
    .await;
    put(&store, "/t/whatever/else".into(), b"x".to_vec()).await;
    put(&store, layout.cursor(), b"-5".to_vec()).await;
    put(&store, layout.policy("bin"), vec![0xc3, 0x28]).await;

    let mut config = OperatorConfig::new("op".into(), layout.clone());
    config.lease_ttl = TTL;
    let (status_tx, op_status) = watch::channel(OperatorStatus::default());
    let (stop_op, stop_rx) = watch::channel(false);
    let s = store.clone();
    let op = tokio::spawn(async move { operator::run(s, config, status_tx, stop_rx).await });

    let sink = Arc::new(Recorder::default());
    let (local, local_rx) = watch::channel(Local::default());
    let (status_tx, node_status) = watch::channel(NodeStatus::default());
    let (stop_node, stop_rx) = watch::channel(false);
    let config = NodeConfig {
        node: "a".into(),
        layout: layout.clone(),
        lease_ttl: TTL,
        state_file: None,
    };
    let (s, k) = (store.clone(), Arc::clone(&sink));
    let node_task = tokio::spawn(async move {
        node::run(s, config, View::default(), k, local_rx, status_tx, stop_rx).await
    });
    local.send_replace(Local {
        endpoints: ["web", "api", "db"]
            .iter()
            .enumerate()
            .map(|(i, app)| LocalEndpoint {
                id: i as u16 + 1,
                name: (*app).into(),
                labels: labels(app),
                ips: vec![format!("10.0.0.{}", i + 1).parse().unwrap()],
            })
            .collect(),
        addresses: vec![],
    });
    // Every used label set gets a valid number: web a fresh one past the damaged 256 and
    // 257, api and db over their damaged keys. No endpoint record that does not parse makes
    // one.
    until(&store, "numbers for web, api and db", || {
        sink.last.lock().unwrap().identities.len() == 3
    })
    .await;
    let table = numbers(&store, &layout).await;
    let view = sink.last.lock().unwrap().clone();
    for app in ["web", "api", "db"] {
        let n = view.identities[&labels(app)];
        assert!((258..=65_535).contains(&n), "{app}: {n}");
        assert_eq!(table[&labels(app)], n);
    }
    assert!(!table.contains_key(&labels("ghost")) && !table.contains_key(&labels("ghost2")));
    // The forged label set never gets a number here.
    assert!(!view.identities.contains_key(&labels("evil")));
    assert!(view.endpoints.is_empty() && view.nodes.is_empty());
    // Refusals are counted by kind, on both sides.
    let rejected = node_status.borrow().rejected.clone();
    assert!(rejected[&RecordKind::Identity] >= 4, "{rejected:?}");
    assert_eq!(rejected[&RecordKind::Endpoint], 3, "{rejected:?}");
    assert_eq!(rejected[&RecordKind::Node], 2, "{rejected:?}");
    assert_eq!(rejected[&RecordKind::Policy], 1, "{rejected:?}");
    assert_eq!(rejected[&RecordKind::Key], 2, "{rejected:?}");
    let s = op_status.borrow().clone();
    assert!(s.connected && s.leading && s.state() == "leader");
    assert_eq!(s.damaged_numbers, 2, "{s:?}");
    assert_eq!(s.rejected[&RecordKind::Endpoint], 3, "{s:?}");

    // More garbage while running, then a minute of watching: allocation goes on, and the log
    // does not grow with time.
    put(&store, layout.identity_by_id(300), b"\x00".to_vec()).await;
    put(
        &store,
        layout.endpoint(&labels("web"), "b", 7),
        b"nope".to_vec(),
    )
    .await;
    local.send_modify(|l| {
        l.endpoints.push(LocalEndpoint {
            id: 9,
            name: "new".into(),
            labels: labels("new"),
            ips: vec!["10.0.0.9".parse().unwrap()],
        });
    });
    until(&store, "a number for a new label set", || {
        sink.last
            .lock()
            .unwrap()
            .identities
            .contains_key(&labels("new"))
    })
    .await;
    let logged = lines.0.load(Ordering::Relaxed);
    for _ in 0..60 {
        store.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        lines.0.load(Ordering::Relaxed),
        logged,
        "the log grows with time"
    );
    assert!(logged <= 40, "{logged} warnings for 17 bad keys");
    assert_eq!(op_status.borrow().refused_creations, 0);

    let _ = stop_op.send(true);
    let _ = stop_node.send(true);
    op.await.unwrap().unwrap();
    node_task.await.unwrap().unwrap();
}
