//! The publisher: answers batched into transactions under expiry-bucket leases, and
//! `fqdnd cache forget`'s changes to the group's keys, retried while the store fails.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::{Answer, LearnedRecord, MAX_TXN_OPS, ShareConfig, ShareStatus, Wall, millis};
use crate::error::StoreError;
use crate::store::{Compare, LeaseId, Op, Store, Txn};

/// What the publisher is asked to do.
#[derive(Debug)]
pub enum Publish {
    /// An answer the gateway learned (or holds while the group lacks it).
    Answer(Answer),
    /// This gateway's keys deleted or rewritten by someone else: what was written under them
    /// is forgotten, so that a later answer writes them again.
    Unwritten(Vec<String>),
    /// `fqdnd cache forget`: pending answers lose what is forgotten, and the group's keys
    /// carrying it are deleted or rewritten without it ([`revoke`]); the outcome goes to the
    /// sender, if any, once the store took it.
    Forget(Forget, Option<oneshot::Sender<Revoked>>),
}

/// What `fqdnd cache forget` takes out of the group's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forget {
    /// The canonical name.
    pub name: String,
    /// Its addresses to forget (`None`: every one).
    pub addrs: Option<Vec<IpAddr>>,
    /// Only the keys of this client group (`None`: every client group's).
    pub client: Option<String>,
}

impl Forget {
    /// Whether `record` is one this forget changes.
    fn matches(&self, name: &str, client: &str, addrs: &[IpAddr]) -> bool {
        name == self.name
            && self.client.as_deref().is_none_or(|c| c == client)
            && self
                .addrs
                .as_ref()
                .is_none_or(|gone| addrs.iter().any(|a| gone.contains(a)))
    }

    /// `addrs` without what this forget takes out.
    fn left(&self, addrs: &[IpAddr]) -> Vec<IpAddr> {
        match &self.addrs {
            None => Vec::new(),
            Some(gone) => addrs
                .iter()
                .filter(|a| !gone.contains(a))
                .copied()
                .collect(),
        }
    }
}

/// What [`revoke`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Revoked {
    /// Keys deleted (nothing left in them).
    pub deleted: usize,
    /// Keys rewritten without the addresses forgotten.
    pub rewritten: usize,
    /// Other gateways' keys etcd refused to change (least-privilege roles: a gateway writes
    /// only its own keys): forget on those gateways too, or delete them with an
    /// administrator's credentials.
    pub denied: usize,
}

/// Deletes the group's keys `forget` matches, or rewrites them without its addresses (the
/// same record otherwise, under the same lease: peers take a rewrite of the same answer with
/// fewer addresses as a revocation of those). This gateway's keys first, then each other
/// gateway's in transactions of their own — so that roles letting a gateway write only its
/// own keys refuse the others' (counted in [`Revoked::denied`]) without holding its own back.
/// Each change is conditional on the key being as read; a key changed meanwhile is read again
/// (up to three times).
///
/// # Errors
/// The store failed (other than refusing another gateway's keys).
pub async fn revoke<S: Store>(
    store: &S,
    config: &ShareConfig,
    forget: &Forget,
) -> Result<Revoked, StoreError> {
    let mut done = Revoked::default();
    let mut refused: BTreeSet<String> = BTreeSet::new();
    for _ in 0..3 {
        let snapshot = store.range(&config.group_prefix()).await?;
        // Gateway (this one first) → its changes.
        let mut changes: BTreeMap<(bool, String), Vec<(Compare, Op)>> = BTreeMap::new();
        for kv in &snapshot.kvs {
            let Some((gateway, _, _)) = config.parse_key(&kv.key) else {
                continue;
            };
            if refused.contains(&gateway) {
                continue;
            }
            let Ok(record) = serde_json::from_slice::<LearnedRecord>(&kv.value) else {
                continue;
            };
            if !forget.matches(&record.name, &record.client, &record.addrs) {
                continue;
            }
            let left = forget.left(&record.addrs);
            let op = if left.is_empty() {
                Op::Delete {
                    key: kv.key.clone(),
                }
            } else {
                let value = LearnedRecord {
                    addrs: left,
                    ..record
                };
                Op::Put {
                    key: kv.key.clone(),
                    value: serde_json::to_vec(&value).unwrap_or_default(),
                    lease: (kv.lease != 0).then_some(kv.lease),
                }
            };
            let compare = Compare::modified_at(kv.key.clone(), kv.mod_revision);
            let others = gateway != config.gateway;
            changes
                .entry((others, gateway))
                .or_default()
                .push((compare, op));
        }
        let mut raced = false;
        for ((others, gateway), changes) in changes {
            let size = MAX_TXN_OPS / 2;
            for (at, chunk) in changes.chunks(size).enumerate() {
                let (compares, ops): (Vec<Compare>, Vec<Op>) = chunk.iter().cloned().unzip();
                let (deleted, rewritten) = ops.iter().fold((0, 0), |(d, r), op| match op {
                    Op::Delete { .. } => (d + 1, r),
                    Op::Put { .. } => (d, r + 1),
                });
                match store.txn(Txn { compares, ops }).await {
                    Ok(outcome) if outcome.succeeded => {
                        done.deleted += deleted;
                        done.rewritten += rewritten;
                    }
                    Ok(_) | Err(StoreError::LeaseNotFound { .. }) => raced = true,
                    Err(StoreError::Denied { reason }) if others => {
                        tracing::warn!(gateway = %gateway, reason, "etcd refused changing another gateway's learned records: forget on that gateway too (or delete its keys as an administrator)");
                        done.denied += changes.len() - at * size;
                        refused.insert(gateway.clone());
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if !raced {
            return Ok(done);
        }
    }
    Ok(done)
}

/// A pending write: the record and when its oldest answer arrived (for the lag).
#[derive(Debug, Clone)]
struct Pending {
    record: LearnedRecord,
    since: Instant,
}

/// The publisher's state: what waits, what was written, the bucket leases.
#[derive(Debug)]
pub struct Publisher {
    config: ShareConfig,
    pending: BTreeMap<String, Pending>,
    /// Key → (addresses, bucket) as written.
    written: BTreeMap<String, (Vec<IpAddr>, u64)>,
    /// Bucket → lease.
    leases: BTreeMap<u64, LeaseId>,
    /// `cache forget`s not yet applied to the store.
    forgets: Vec<(Forget, Option<oneshot::Sender<Revoked>>)>,
    dropped: u64,
}

impl Publisher {
    /// An empty publisher.
    pub fn new(config: ShareConfig) -> Self {
        Self {
            config,
            pending: BTreeMap::new(),
            written: BTreeMap::new(),
            leases: BTreeMap::new(),
            forgets: Vec::new(),
            dropped: 0,
        }
    }

    /// Keys waiting to be written.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// `cache forget`s waiting for the store.
    pub fn forgets_pending(&self) -> usize {
        self.forgets.len()
    }

    /// Whether anything waits for the store.
    pub fn has_work(&self) -> bool {
        !self.pending.is_empty() || !self.forgets.is_empty()
    }

    /// Answers dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn bucket_ms(&self) -> u64 {
        u64::try_from(self.config.bucket.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The bucket an expiry falls in.
    fn bucket_of(&self, expires_ms: u64) -> u64 {
        expires_ms.div_ceil(self.bucket_ms())
    }

    /// Takes in a command (the channel's).
    pub fn take(&mut self, command: Publish, at: Instant) {
        match command {
            Publish::Answer(answer) => self.offer(answer, at),
            Publish::Unwritten(keys) => {
                for key in keys {
                    self.written.remove(&key);
                }
            }
            Publish::Forget(forget, reply) => self.forget(forget, reply),
        }
    }

    /// `cache forget`: pending answers lose what is forgotten (a key left with nothing is no
    /// longer written), this gateway's keys it matches count as not written, and the change
    /// of the group's keys waits for the next flush.
    pub fn forget(&mut self, forget: Forget, reply: Option<oneshot::Sender<Revoked>>) {
        self.pending.retain(|_, p| {
            let r = &mut p.record;
            if forget.matches(&r.name, &r.client, &r.addrs) {
                r.addrs = forget.left(&r.addrs);
            }
            !r.addrs.is_empty()
        });
        let config = &self.config;
        self.written.retain(|key, _| {
            config.parse_key(key).is_none_or(|(_, client, name)| {
                name != forget.name || forget.client.as_deref().is_some_and(|c| c != client)
            })
        });
        self.forgets.push((forget, reply));
    }

    /// Adds an answer to the pending set (merged with a pending one of the same key).
    pub fn offer(&mut self, answer: Answer, at: Instant) {
        let key = self.config.key(&answer.client, &answer.name);
        let expires_ms = answer
            .learned_ms
            .saturating_add(u64::from(answer.ttl) * 1000);
        let mut addrs = answer.addrs;
        addrs.sort_unstable();
        addrs.dedup();
        if let Some(p) = self.pending.get_mut(&key) {
            let r = &mut p.record;
            r.addrs.extend(addrs);
            r.addrs.sort_unstable();
            r.addrs.dedup();
            if expires_ms > r.expires_ms {
                r.expires_ms = expires_ms;
                r.ttl = answer.ttl;
                r.learned_ms = answer.learned_ms;
            }
            return;
        }
        // Already written with these addresses, to the same bucket: nothing new.
        if let Some((written, bucket)) = self.written.get(&key)
            && *bucket == self.bucket_of(expires_ms)
            && addrs.iter().all(|a| written.binary_search(a).is_ok())
        {
            return;
        }
        if self.pending.len() >= self.config.max_pending {
            self.dropped += 1;
            return;
        }
        self.pending.insert(
            key,
            Pending {
                record: LearnedRecord {
                    name: answer.name,
                    client: answer.client,
                    addrs,
                    ttl: answer.ttl,
                    learned_ms: answer.learned_ms,
                    expires_ms,
                    gateway: self.config.gateway.clone(),
                },
                since: at,
            },
        );
    }

    /// Forgets leases and written keys whose bucket ended (their keys are gone).
    fn prune(&mut self, now_ms: u64) {
        let current = now_ms / self.bucket_ms();
        // A lease reaches one bucket past its bucket's end.
        self.leases.retain(|bucket, _| bucket + 1 > current);
        self.written.retain(|_, (_, bucket)| *bucket + 1 > current);
    }

    /// The lease of `bucket`, granted if needed.
    async fn lease<S: Store>(
        &mut self,
        store: &S,
        bucket: u64,
        now_ms: u64,
    ) -> Result<LeaseId, StoreError> {
        if let Some(lease) = self.leases.get(&bucket) {
            return Ok(*lease);
        }
        let end_ms = (bucket + 1).saturating_mul(self.bucket_ms());
        let ttl = Duration::from_millis(end_ms.saturating_sub(now_ms)).max(Duration::from_secs(2));
        let lease = store.grant(ttl).await?;
        self.leases.insert(bucket, lease);
        Ok(lease)
    }

    /// Applies the waiting `cache forget`s to the store, in order; each done is answered.
    ///
    /// # Errors
    /// The store failed (the forgets not applied stay waiting).
    async fn revoke_all<S: Store>(&mut self, store: &S) -> Result<(), StoreError> {
        while let Some((forget, _)) = self.forgets.first() {
            let done = match revoke(store, &self.config, forget).await {
                Ok(done) => done,
                // Tried again with the next flush.
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    // Refused as such (its own keys included): trying again changes nothing,
                    // and the answers waiting behind it must still be written.
                    tracing::error!(name = %forget.name, error = %e, "etcd refused a cache forget's change of the HA group's records: only this gateway forgot it");
                    Revoked::default()
                }
            };
            tracing::info!(name = %forget.name, deleted = done.deleted, rewritten = done.rewritten, denied = done.denied, "forgotten in the HA group's records");
            let (_, reply) = self.forgets.remove(0);
            if let Some(reply) = reply {
                let _ = reply.send(done);
            }
        }
        Ok(())
    }

    /// Applies the waiting forgets, then writes everything pending; returns (records
    /// written, transactions, the oldest written answer's wait). What could not be written
    /// stays pending.
    ///
    /// # Errors
    /// The store failed (what was written before stays written).
    pub async fn flush<S: Store>(
        &mut self,
        store: &S,
        now_ms: u64,
        now: Instant,
    ) -> Result<(u64, u64, Duration), StoreError> {
        self.revoke_all(store).await?;
        self.prune(now_ms);
        let mut written = 0;
        let mut transactions = 0;
        let mut lag = Duration::ZERO;
        // Expired while waiting: nothing to publish.
        self.pending.retain(|_, p| p.record.expires_ms > now_ms);
        let keys: Vec<String> = self.pending.keys().cloned().collect();
        for chunk in keys.chunks(MAX_TXN_OPS) {
            let mut attempt = 0;
            loop {
                let mut ops = Vec::with_capacity(chunk.len());
                let mut used = BTreeSet::new();
                for key in chunk {
                    let Some(p) = self.pending.get(key) else {
                        continue;
                    };
                    let bucket = self.bucket_of(p.record.expires_ms);
                    let value = serde_json::to_vec(&p.record).unwrap_or_default();
                    let lease = self.lease(store, bucket, now_ms).await?;
                    used.insert(bucket);
                    ops.push(Op::Put {
                        key: key.clone(),
                        value,
                        lease: Some(lease),
                    });
                }
                match store
                    .txn(Txn {
                        compares: Vec::new(),
                        ops,
                    })
                    .await
                {
                    Ok(_) => break,
                    Err(StoreError::LeaseNotFound { .. }) if attempt == 0 => {
                        // A lease expired under us (a long outage): new ones, once.
                        attempt += 1;
                        for bucket in used {
                            self.leases.remove(&bucket);
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            transactions += 1;
            for key in chunk {
                if let Some(p) = self.pending.remove(key) {
                    written += 1;
                    lag = lag.max(now.saturating_duration_since(p.since));
                    let bucket = self.bucket_of(p.record.expires_ms);
                    self.written.insert(key.clone(), (p.record.addrs, bucket));
                }
            }
        }
        Ok((written, transactions, lag))
    }
}

/// Runs the publisher until `commands` closes or `stop`: batches of `batch_delay`, retried
/// with backoff while the store fails.
pub async fn publish<S: Store, W: Wall>(
    store: S,
    config: ShareConfig,
    wall: Arc<W>,
    mut commands: mpsc::Receiver<Publish>,
    status: watch::Sender<ShareStatus>,
    mut stop: watch::Receiver<bool>,
) {
    let delay = config.batch_delay;
    let mut publisher = Publisher::new(config);
    let mut next: Option<Instant> = None;
    let mut backoff = Duration::from_millis(100);
    loop {
        let timer = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = commands.recv() => match command {
                Some(command) => {
                    publisher.take(command, Instant::now());
                    // Whatever else is queued joins the batch now.
                    while let Ok(more) = commands.try_recv() {
                        publisher.take(more, Instant::now());
                    }
                    if next.is_none() && publisher.has_work() {
                        next = Some(Instant::now() + delay);
                    }
                    let (pending, dropped, forgets) =
                        (publisher.pending(), publisher.dropped(), publisher.forgets_pending());
                    status.send_modify(|s| {
                        s.pending = pending;
                        s.dropped = s.dropped.max(dropped);
                        s.forgets_pending = forgets;
                    });
                }
                None => return,
            },
            () = timer => {
                match publisher.flush(&store, wall.unix_ms(), Instant::now()).await {
                    Ok((written, transactions, lag)) => {
                        backoff = Duration::from_millis(100);
                        next = publisher.has_work().then(|| Instant::now() + delay);
                        let (pending, forgets) = (publisher.pending(), publisher.forgets_pending());
                        status.send_modify(|s| {
                            s.publishing = true;
                            s.published += written;
                            s.transactions += transactions;
                            s.pending = pending;
                            s.forgets_pending = forgets;
                            if written > 0 {
                                s.publish_lag_ms = millis(lag);
                                s.publish_lag_max_ms = s.publish_lag_max_ms.max(millis(lag));
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, pending = publisher.pending(), forgets = publisher.forgets_pending(), "publishing learned answers failed: retrying");
                        next = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                        let (pending, forgets) = (publisher.pending(), publisher.forgets_pending());
                        status.send_modify(|s| {
                            s.publishing = false;
                            s.pending = pending;
                            s.forgets_pending = forgets;
                            s.last_error = Some(e.to_string());
                        });
                    }
                }
            }
            changed = stop.changed() => {
                // Stopped, or the daemon is gone.
                if changed.is_err() || *stop.borrow() {
                    if publisher.has_work() {
                        let _ = publisher.flush(&store, wall.unix_ms(), Instant::now()).await;
                    }
                    return;
                }
            }
        }
    }
}
