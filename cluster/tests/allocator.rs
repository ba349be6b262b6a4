//! The allocator's algorithm against the in-memory store: several allocators with views of
//! any staleness, deposed leaders and concurrent endpoint churn never make a duplicate
//! identity, never collect one an endpoint uses, and converge.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use fqdnd_cluster::{
    Allocator, Compare, EndpointRecord, Key, Label, Labels, Layout, MemoryStore, Op, Revision,
    Store, Txn, Watch, check_identities,
};
use proptest::prelude::*;

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn labels(n: u8) -> Labels {
    Labels::from(vec![Label {
        source: "k8s".into(),
        key: "app".into(),
        value: format!("app{n}"),
    }])
}

/// The leader key, created by `name` (`None`: deleted), returning its create revision.
async fn take_leadership(store: &MemoryStore, layout: &Layout, name: &str) -> Revision {
    store
        .txn(Txn {
            compares: vec![],
            ops: vec![Op::Delete {
                key: layout.leader(),
            }],
        })
        .await
        .unwrap();
    store
        .txn(Txn {
            compares: vec![Compare::missing(layout.leader())],
            ops: vec![Op::Put {
                key: layout.leader(),
                value: name.as_bytes().to_vec(),
                lease: None,
            }],
        })
        .await
        .unwrap()
        .revision
}

async fn current_token(store: &MemoryStore, layout: &Layout) -> Revision {
    let snapshot = store.range(&layout.leader()).await.unwrap();
    snapshot.kvs.first().map_or(0, |kv| kv.create_revision)
}

async fn put_endpoint(store: &MemoryStore, layout: &Layout, set: u8, node: u8, id: u16) {
    store
        .txn(Txn {
            compares: vec![],
            ops: vec![Op::Put {
                key: layout.endpoint(&labels(set), &format!("n{node}"), id),
                value: EndpointRecord::new(&format!("n{node}"), id, labels(set)).to_value(),
                lease: None,
            }],
        })
        .await
        .unwrap();
}

async fn delete_endpoint(store: &MemoryStore, layout: &Layout, set: u8, node: u8, id: u16) {
    store
        .txn(Txn {
            compares: vec![],
            ops: vec![Op::Delete {
                key: layout.endpoint(&labels(set), &format!("n{node}"), id),
            }],
        })
        .await
        .unwrap();
}

/// One allocator instance as the test drives it: a view that lags behind the store by as
/// many watch batches as the test lets it.
struct Instance {
    alloc: Allocator,
    watch: fqdnd_cluster::MemoryWatch,
    token: Revision,
}

impl Instance {
    async fn new(store: &MemoryStore, layout: &Layout, now: Duration) -> Self {
        let snapshot = store.range(&layout.root()).await.unwrap();
        let mut alloc = Allocator::new(layout.clone());
        alloc.load(&snapshot, now);
        let watch = store
            .watch(&layout.root(), snapshot.revision + 1)
            .await
            .unwrap();
        Self {
            alloc,
            watch,
            token: 0,
        }
    }

    /// Applies one pending watch batch, if there is one.
    async fn catch_up_one(&mut self, now: Duration) {
        if let Ok(Ok(batch)) =
            tokio::time::timeout(Duration::from_millis(1), self.watch.next()).await
        {
            self.alloc.apply(&batch.events, now);
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// An endpoint of label set `set` appears on node `node`.
    Register { set: u8, node: u8 },
    /// It goes.
    Unregister { set: u8, node: u8 },
    /// Allocator `who` catches up by one watch batch.
    CatchUp { who: usize },
    /// Allocator `who` becomes the leader (the previous one is deposed but keeps running).
    Elect { who: usize },
    /// Allocator `who` runs its plan's creations with its (maybe deposed) token, or — as if
    /// fencing failed — with the current leader's; the numbers shifted by `shift` (whatever
    /// numbers a stale view picks, the transaction must keep the store duplicate-free).
    Create {
        who: usize,
        unfenced: bool,
        shift: u32,
    },
    /// Allocator `who` runs its plan's collections.
    Collect { who: usize },
    /// Time passes.
    Wait { seconds: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..5, 0u8..3).prop_map(|(set, node)| Step::Register { set, node }),
        2 => (0u8..5, 0u8..3).prop_map(|(set, node)| Step::Unregister { set, node }),
        4 => (0usize..3).prop_map(|who| Step::CatchUp { who }),
        1 => (0usize..3).prop_map(|who| Step::Elect { who }),
        3 => (0usize..3, any::<bool>(), 0u32..3).prop_map(|(who, unfenced, shift)| Step::Create { who, unfenced, shift }),
        2 => (0usize..3).prop_map(|who| Step::Collect { who }),
        1 => (1u8..40).prop_map(|seconds| Step::Wait { seconds }),
    ]
}

const GRACE: Duration = Duration::from_secs(30);

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_duplicate_no_collection_of_a_used_identity_and_convergence(
        steps in proptest::collection::vec(step(), 1..80)
    ) {
        block_on(async {
            let store = MemoryStore::new();
            let layout = Layout::new("/t");
            let mut now = Duration::ZERO;
            let mut instances = Vec::new();
            for _ in 0..3 {
                instances.push(Instance::new(&store, &layout, now).await);
            }
            instances[0].token = take_leadership(&store, &layout, "a0").await;
            for step in steps {
                match step {
                    Step::Register { set, node } => put_endpoint(&store, &layout, set, node, 1).await,
                    Step::Unregister { set, node } => delete_endpoint(&store, &layout, set, node, 1).await,
                    Step::CatchUp { who } => instances[who].catch_up_one(now).await,
                    Step::Elect { who } => {
                        instances[who].token = take_leadership(&store, &layout, &format!("a{who}")).await;
                    }
                    Step::Create { who, unfenced, shift } => {
                        let current = current_token(&store, &layout).await;
                        let i = &mut instances[who];
                        let mut plan = i.alloc.plan(now, GRACE, 4);
                        for (_, id) in &mut plan.create {
                            *id += shift;
                        }
                        let token = if unfenced { current } else { i.token };
                        if !plan.create.is_empty() {
                            let outcome = store.txn(i.alloc.create_txn(&plan.create, token)).await.unwrap();
                            if outcome.succeeded {
                                i.alloc.created(&plan.create, outcome.revision, now);
                            }
                        }
                    }
                    Step::Collect { who } => {
                        let i = &mut instances[who];
                        for (id, set) in i.alloc.plan(now, GRACE, 0).collect {
                            let Some(txn) = i.alloc.gc_txn(id, &set, i.token) else { continue };
                            if store.txn(txn).await.unwrap().succeeded {
                                i.alloc.collected(id, &set);
                                // Nothing of the label set may be in use.
                                let users = store.range(&layout.endpoints_of(&set)).await.unwrap();
                                assert!(users.kvs.is_empty(), "collected {id} ({set}) while {} endpoints use it", users.kvs.len());
                            }
                        }
                    }
                    Step::Wait { seconds } => now += Duration::from_secs(seconds.into()),
                }
                let snapshot = store.range(&layout.root()).await.unwrap();
                if let Err(e) = check_identities(&layout, &snapshot.kvs) {
                    panic!("store invariant broken: {e}");
                }
            }
            // Convergence: the leader, caught up, gives every used label set one identity.
            let token = current_token(&store, &layout).await;
            let mut fresh = Allocator::new(layout.clone());
            for _round in 0..10 {
                let snapshot = store.range(&layout.root()).await.unwrap();
                fresh.load(&snapshot, now);
                let plan = fresh.plan(now, GRACE, 64);
                if plan.create.is_empty() {
                    break;
                }
                assert!(store.txn(fresh.create_txn(&plan.create, token)).await.unwrap().succeeded);
            }
            let snapshot = store.range(&layout.root()).await.unwrap();
            let table = check_identities(&layout, &snapshot.kvs).unwrap();
            let used: BTreeSet<Labels> = snapshot.kvs.iter().filter_map(|kv| match layout.parse(&kv.key) {
                Some(Key::Endpoint { labels, .. }) => Some(labels),
                _ => None,
            }).collect();
            let numbered: BTreeSet<Labels> = table.values().cloned().collect();
            assert!(used.is_subset(&numbered), "used {used:?}, numbered {numbered:?}");
        });
    }
}

#[test]
fn a_deposed_leader_cannot_write_and_numbers_are_next_fit() {
    block_on(async {
        let store = MemoryStore::new();
        let layout = Layout::new("/t");
        let now = Duration::ZERO;
        let mut a = Instance::new(&store, &layout, now).await;
        a.token = take_leadership(&store, &layout, "a").await;
        put_endpoint(&store, &layout, 1, 1, 1).await;
        put_endpoint(&store, &layout, 2, 1, 2).await;
        a.catch_up_one(now).await;
        a.catch_up_one(now).await;
        let plan = a.alloc.plan(now, GRACE, 8);
        assert_eq!(
            plan.create,
            vec![(labels(1), 256), (labels(2), 257)],
            "label sets in order, numbers from the bottom of the range"
        );
        let mut b = Instance::new(&store, &layout, now).await;
        b.token = take_leadership(&store, &layout, "b").await;
        assert!(
            !store
                .txn(a.alloc.create_txn(&plan.create, a.token))
                .await
                .unwrap()
                .succeeded,
            "fenced: a is no longer the leader"
        );
        let outcome = store
            .txn(
                b.alloc
                    .create_txn(&b.alloc.plan(now, GRACE, 8).create, b.token),
            )
            .await
            .unwrap();
        assert!(outcome.succeeded);
        // The cursor moved on: after 257 is freed, the next set gets 258, not 257.
        let fresh = store.range(&layout.root()).await.unwrap();
        let mut c = Allocator::new(layout.clone());
        c.load(&fresh, now);
        put_endpoint(&store, &layout, 3, 1, 3).await;
        c.load(&store.range(&layout.root()).await.unwrap(), now);
        assert_eq!(c.plan(now, GRACE, 8).create, vec![(labels(3), 258)]);
    });
}

#[test]
fn collection_waits_for_the_grace_and_fails_if_an_endpoint_appeared_meanwhile() {
    block_on(async {
        let store = MemoryStore::new();
        let layout = Layout::new("/t");
        let mut a = Instance::new(&store, &layout, Duration::ZERO).await;
        a.token = take_leadership(&store, &layout, "a").await;
        put_endpoint(&store, &layout, 1, 1, 1).await;
        a.catch_up_one(Duration::ZERO).await;
        let plan = a.alloc.plan(Duration::ZERO, GRACE, 8);
        let outcome = store
            .txn(a.alloc.create_txn(&plan.create, a.token))
            .await
            .unwrap();
        a.alloc
            .created(&plan.create, outcome.revision, Duration::ZERO);
        a.catch_up_one(Duration::ZERO).await;
        delete_endpoint(&store, &layout, 1, 1, 1).await;
        a.catch_up_one(Duration::from_secs(10)).await;
        assert!(
            a.alloc
                .plan(Duration::from_secs(39), GRACE, 0)
                .collect
                .is_empty(),
            "unused for 29 s only"
        );
        let plan = a.alloc.plan(Duration::from_secs(40), GRACE, 0);
        assert_eq!(plan.collect, vec![(256, labels(1))]);
        // An endpoint of the set comes back before the delete: the delete must fail.
        put_endpoint(&store, &layout, 1, 2, 9).await;
        let txn = a.alloc.gc_txn(256, &labels(1), a.token).unwrap();
        assert!(!store.txn(txn).await.unwrap().succeeded);
        let snapshot = store.range(&layout.root()).await.unwrap();
        assert_eq!(check_identities(&layout, &snapshot.kvs).unwrap().len(), 1);
    });
}
