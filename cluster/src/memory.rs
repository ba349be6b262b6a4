//! [`MemoryStore`]: etcd's data model in memory — revisions, transactions with key and prefix
//! compares, leases that expire on a virtual clock, ordered watches with compaction — so the
//! allocator and the node sync are tested without etcd, deterministically.
//!
//! Differences from etcd that the tests do not depend on: no authentication, no request size
//! limits, compaction only when asked ([`MemoryStore::compact`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::error::StoreError;
use crate::keys::prefix_end;
use crate::store::{
    Event, Kv, LeaseId, Op, Revision, Snapshot, Store, Txn, TxnOutcome, Watch, WatchBatch,
};

#[derive(Debug)]
struct Lease {
    ttl: Duration,
    expires: Duration,
}

#[derive(Debug)]
struct Inner {
    kvs: BTreeMap<String, Kv>,
    /// The revision of the last change (etcd starts at 1).
    revision: Revision,
    /// Every event since `compacted`, in revision order.
    history: Vec<Event>,
    compacted: Revision,
    leases: BTreeMap<LeaseId, Lease>,
    next_lease: LeaseId,
    now: Duration,
    down: bool,
}

/// etcd's v3 data model in memory, on a virtual clock ([`MemoryStore::advance`]).
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    /// The revision of the last change (or a bump when the store goes down), for watchers.
    changed: Arc<watch::Sender<Revision>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store at revision 1, time zero.
    pub fn new() -> Self {
        let (changed, _) = watch::channel(1);
        Self {
            inner: Arc::new(Mutex::new(Inner {
                kvs: BTreeMap::new(),
                revision: 1,
                history: Vec::new(),
                compacted: 0,
                leases: BTreeMap::new(),
                next_lease: 0x1000,
                now: Duration::ZERO,
                down: false,
            })),
            changed: Arc::new(changed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every change is made under
        // one lock, before any await): carry on.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn notify(&self, revision: Revision) {
        self.changed.send_replace(revision);
    }

    /// Moves the virtual clock forward by `by`; leases past their expiry are revoked (their
    /// keys deleted, one revision per lease, as etcd does) — unless the store is down.
    pub fn advance(&self, by: Duration) {
        let revision = {
            let mut inner = self.lock();
            inner.now += by;
            let now = inner.now;
            if inner.down {
                return;
            }
            let expired: Vec<LeaseId> = inner
                .leases
                .iter()
                .filter(|(_, l)| l.expires <= now)
                .map(|(id, _)| *id)
                .collect();
            for id in expired {
                inner.revoke(id);
            }
            inner.revision
        };
        self.notify(revision);
    }

    /// The virtual time.
    pub fn now(&self) -> Duration {
        self.lock().now
    }

    /// Takes the store down (every call fails as unreachable, watches end) or brings it back.
    /// While down, leases do not expire: etcd renews every lease when it elects a leader again.
    pub fn set_down(&self, down: bool) {
        let revision = {
            let mut inner = self.lock();
            if inner.down && !down {
                let now = inner.now;
                for lease in inner.leases.values_mut() {
                    lease.expires = now + lease.ttl;
                }
            }
            inner.down = down;
            inner.revision
        };
        self.notify(revision);
    }

    /// Forgets the events before `revision`: a watch from an older revision gets
    /// [`StoreError::Compacted`].
    pub fn compact(&self, revision: Revision) {
        let mut inner = self.lock();
        let revision = revision.min(inner.revision + 1);
        inner.history.retain(|e| e.revision() >= revision);
        inner.compacted = inner.compacted.max(revision);
    }

    /// The revision of the last change.
    pub fn revision(&self) -> Revision {
        self.lock().revision
    }

    /// Every key and value, for assertions.
    pub fn dump(&self) -> BTreeMap<String, Vec<u8>> {
        self.lock()
            .kvs
            .iter()
            .map(|(k, kv)| (k.clone(), kv.value.clone()))
            .collect()
    }

    /// The live leases.
    pub fn leases(&self) -> BTreeSet<LeaseId> {
        self.lock().leases.keys().copied().collect()
    }

    fn unavailable() -> StoreError {
        StoreError::Unavailable {
            reason: "the in-memory store is down".to_owned(),
        }
    }
}

impl Inner {
    fn range<'a>(&'a self, key: &str, end: Option<&[u8]>) -> Vec<&'a Kv> {
        match end {
            None => self.kvs.get(key).into_iter().collect(),
            Some(end) => self
                .kvs
                .range(key.to_owned()..)
                .take_while(|(k, _)| k.as_bytes() < end)
                .map(|(_, kv)| kv)
                .collect(),
        }
    }

    fn revoke(&mut self, id: LeaseId) -> bool {
        if self.leases.remove(&id).is_none() {
            return false;
        }
        let keys: Vec<String> = self
            .kvs
            .values()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key.clone())
            .collect();
        if !keys.is_empty() {
            self.revision += 1;
            let revision = self.revision;
            for key in keys {
                self.kvs.remove(&key);
                self.history.push(Event::Delete { key, revision });
            }
        }
        true
    }

    fn txn(&mut self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        let mut seen = BTreeSet::new();
        for op in &txn.ops {
            let key = match op {
                Op::Put { key, lease, .. } => {
                    if let Some(lease) = lease
                        && !self.leases.contains_key(lease)
                    {
                        return Err(StoreError::LeaseNotFound { lease: *lease });
                    }
                    key
                }
                Op::Delete { key } => key,
            };
            if !seen.insert(key.as_str()) {
                return Err(StoreError::Refused {
                    reason: format!("duplicate key given in txn request: {key}"),
                });
            }
        }
        let holds = txn.compares.iter().all(|c| {
            let end = c.range_end();
            let kvs = self.range(&c.key, end.as_deref());
            if kvs.is_empty() {
                c.holds_for(None)
            } else {
                kvs.into_iter().all(|kv| c.holds_for(Some(kv)))
            }
        });
        if !holds {
            return Ok(TxnOutcome {
                succeeded: false,
                revision: self.revision,
            });
        }
        let writes = txn.ops.iter().any(|op| match op {
            Op::Put { .. } => true,
            Op::Delete { key } => self.kvs.contains_key(key),
        });
        if !writes {
            return Ok(TxnOutcome {
                succeeded: true,
                revision: self.revision,
            });
        }
        self.revision += 1;
        let revision = self.revision;
        for op in txn.ops {
            match op {
                Op::Put { key, value, lease } => {
                    let kv = match self.kvs.get(&key) {
                        Some(old) => Kv {
                            key: key.clone(),
                            value,
                            create_revision: old.create_revision,
                            mod_revision: revision,
                            version: old.version + 1,
                            lease: lease.unwrap_or(0),
                        },
                        None => Kv {
                            key: key.clone(),
                            value,
                            create_revision: revision,
                            mod_revision: revision,
                            version: 1,
                            lease: lease.unwrap_or(0),
                        },
                    };
                    self.kvs.insert(key, kv.clone());
                    self.history.push(Event::Put(kv));
                }
                Op::Delete { key } => {
                    if self.kvs.remove(&key).is_some() {
                        self.history.push(Event::Delete { key, revision });
                    }
                }
            }
        }
        Ok(TxnOutcome {
            succeeded: true,
            revision,
        })
    }
}

/// A watch on a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryWatch {
    store: MemoryStore,
    prefix: String,
    end: Vec<u8>,
    next: Revision,
    changed: watch::Receiver<Revision>,
}

impl Watch for MemoryWatch {
    async fn next(&mut self) -> Result<WatchBatch, StoreError> {
        loop {
            self.changed.borrow_and_update();
            {
                let inner = self.store.lock();
                if inner.down {
                    return Err(MemoryStore::unavailable());
                }
                if self.next < inner.compacted {
                    return Err(StoreError::Compacted {
                        requested: self.next,
                        compacted: inner.compacted,
                    });
                }
                let start = inner.history.partition_point(|e| e.revision() < self.next);
                let events: Vec<Event> = inner.history[start..]
                    .iter()
                    .filter(|e| {
                        e.key().starts_with(&self.prefix) && e.key().as_bytes() < &self.end[..]
                    })
                    .cloned()
                    .collect();
                self.next = inner.revision + 1;
                if !events.is_empty() {
                    return Ok(WatchBatch {
                        events,
                        revision: inner.revision,
                    });
                }
            }
            if self.changed.changed().await.is_err() {
                return Err(MemoryStore::unavailable());
            }
        }
    }
}

impl Store for MemoryStore {
    type Watch = MemoryWatch;

    async fn range(&self, prefix: &str) -> Result<Snapshot, StoreError> {
        let inner = self.lock();
        if inner.down {
            return Err(Self::unavailable());
        }
        let end = prefix_end(prefix);
        Ok(Snapshot {
            kvs: inner
                .range(prefix, Some(&end))
                .into_iter()
                .cloned()
                .collect(),
            revision: inner.revision,
        })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        let outcome = {
            let mut inner = self.lock();
            if inner.down {
                return Err(Self::unavailable());
            }
            inner.txn(txn)?
        };
        self.notify(outcome.revision);
        Ok(outcome)
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let mut inner = self.lock();
        if inner.down {
            return Err(Self::unavailable());
        }
        let id = inner.next_lease;
        inner.next_lease += 1;
        let expires = inner.now + ttl;
        inner.leases.insert(id, Lease { ttl, expires });
        Ok(id)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        if inner.down {
            return Err(Self::unavailable());
        }
        let now = inner.now;
        Ok(match inner.leases.get_mut(&lease) {
            Some(l) => {
                l.expires = now + l.ttl;
                true
            }
            None => false,
        })
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        let revision = {
            let mut inner = self.lock();
            if inner.down {
                return Err(Self::unavailable());
            }
            inner.revoke(lease);
            inner.revision
        };
        self.notify(revision);
        Ok(())
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<MemoryWatch, StoreError> {
        if self.lock().down {
            return Err(Self::unavailable());
        }
        Ok(MemoryWatch {
            store: self.clone(),
            prefix: prefix.to_owned(),
            end: prefix_end(prefix),
            next: from,
            changed: self.changed.subscribe(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Compare;
    use std::future::Future;

    fn put(key: &str, value: &str, lease: Option<LeaseId>) -> Op {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease,
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn compare_and_create_lets_one_of_two_writers_win() {
        block_on(async {
            let s = MemoryStore::new();
            let create = |v: &str| Txn {
                compares: vec![Compare::missing("/k")],
                ops: vec![put("/k", v, None)],
            };
            let first = s.txn(create("a")).await.unwrap();
            let second = s.txn(create("b")).await.unwrap();
            assert!(first.succeeded && !second.succeeded);
            assert_eq!(s.dump()["/k"], b"a");
            assert_eq!(second.revision, first.revision);
        });
    }

    #[test]
    fn a_prefix_compare_sees_keys_created_after_a_revision_and_holds_on_an_empty_range() {
        block_on(async {
            let s = MemoryStore::new();
            let r0 = s.revision();
            let guarded = |rev| Txn {
                compares: vec![Compare::unchanged_since("/p/", rev)],
                ops: vec![put("/x", "1", None)],
            };
            assert!(s.txn(guarded(r0)).await.unwrap().succeeded, "empty range");
            let r1 = s.txn(guarded(r0)).await.unwrap().revision;
            s.txn(Txn {
                compares: vec![],
                ops: vec![put("/p/a", "1", None)],
            })
            .await
            .unwrap();
            assert!(!s.txn(guarded(r1)).await.unwrap().succeeded);
            assert!(s.txn(guarded(s.revision())).await.unwrap().succeeded);
            // A key outside the prefix that shares its start is not in the range.
            s.txn(Txn {
                compares: vec![],
                ops: vec![put("/p0", "1", None)],
            })
            .await
            .unwrap();
            let r = s.revision() - 1;
            assert!(s.txn(guarded(r)).await.unwrap().succeeded);
        });
    }

    #[test]
    fn expired_leases_take_their_keys_and_a_put_on_them_fails() {
        block_on(async {
            let s = MemoryStore::new();
            let lease = s.grant(Duration::from_secs(5)).await.unwrap();
            s.txn(Txn {
                compares: vec![],
                ops: vec![put("/a", "1", Some(lease)), put("/b", "1", None)],
            })
            .await
            .unwrap();
            s.advance(Duration::from_secs(3));
            assert!(s.keep_alive(lease).await.unwrap());
            s.advance(Duration::from_secs(4));
            assert!(
                s.dump().contains_key("/a"),
                "renewed at 3 s: expires at 8 s"
            );
            s.advance(Duration::from_secs(1));
            assert!(!s.dump().contains_key("/a"));
            assert!(s.dump().contains_key("/b"));
            assert!(!s.keep_alive(lease).await.unwrap());
            let err = s
                .txn(Txn {
                    compares: vec![],
                    ops: vec![put("/c", "1", Some(lease))],
                })
                .await
                .unwrap_err();
            assert_eq!(err, StoreError::LeaseNotFound { lease });
        });
    }

    #[test]
    fn watches_deliver_in_revision_order_from_any_revision_until_compacted() {
        block_on(async {
            let s = MemoryStore::new();
            let from = s.revision() + 1;
            for (k, v) in [("/w/a", "1"), ("/other", "x"), ("/w/b", "2")] {
                s.txn(Txn {
                    compares: vec![],
                    ops: vec![put(k, v, None)],
                })
                .await
                .unwrap();
            }
            s.txn(Txn {
                compares: vec![],
                ops: vec![Op::Delete { key: "/w/a".into() }],
            })
            .await
            .unwrap();
            let mut w = s.watch("/w/", from).await.unwrap();
            let batch = w.next().await.unwrap();
            let keys: Vec<(&str, Revision)> = batch
                .events
                .iter()
                .map(|e| (e.key(), e.revision()))
                .collect();
            assert_eq!(keys, [("/w/a", 2), ("/w/b", 4), ("/w/a", 5)]);
            assert!(matches!(batch.events[2], Event::Delete { .. }));
            s.compact(4);
            let mut old = s.watch("/w/", from).await.unwrap();
            assert!(matches!(
                old.next().await,
                Err(StoreError::Compacted { requested: 2, .. })
            ));
            // A live watch wakes up on a later change; going down ends it.
            let s2 = s.clone();
            let waiter = tokio::spawn(async move { w.next().await });
            tokio::task::yield_now().await;
            s2.txn(Txn {
                compares: vec![],
                ops: vec![put("/w/c", "3", None)],
            })
            .await
            .unwrap();
            let batch = waiter.await.unwrap().unwrap();
            assert_eq!(batch.events.len(), 1);
            let mut w = s.watch("/w/", s.revision() + 1).await.unwrap();
            s.set_down(true);
            assert!(matches!(
                w.next().await,
                Err(StoreError::Unavailable { .. })
            ));
        });
    }

    #[test]
    fn a_key_twice_in_one_transaction_is_refused() {
        block_on(async {
            let s = MemoryStore::new();
            let err = s
                .txn(Txn {
                    compares: vec![],
                    ops: vec![put("/a", "1", None), Op::Delete { key: "/a".into() }],
                })
                .await
                .unwrap_err();
            assert!(matches!(err, StoreError::Refused { .. }));
        });
    }
}
