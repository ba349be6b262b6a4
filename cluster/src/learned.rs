//! A highly available gateway group (docs/ha-gateway.md): what each gateway's DNS answers
//! taught, shared through the store so that a peer enforces it too.
//!
//! - **Keys.** `<p>-learned/<group>/<gateway>/<client>/<name>` → [`LearnedRecord`] (JSON),
//!   under a sibling of the cluster prefix (the node side's watch of `<p>/` never sees them),
//!   each part percent-encoded outside `A-Z a-z 0-9 . _ -`. One key per gateway, client group
//!   and name: peers never overwrite each other; an importer takes the union.
//! - **Leases.** A key lives under the lease of its expiry bucket ([`ShareConfig::bucket`]
//!   wide), granted to end one bucket after the bucket's end: entries expire on their own, and
//!   outlive the gateway that wrote them (a gateway joining later still imports them).
//! - **Publishing** ([`publish`]): answers come over a channel; the first of a batch starts a
//!   [`ShareConfig::batch_delay`] timer; the batch is merged by key and written in
//!   transactions of at most [`MAX_TXN_OPS`] operations. A key whose addresses and bucket were
//!   already written is skipped. On a store error the pending set is kept (bounded) and
//!   retried with backoff.
//! - **Importing** ([`import`]): a range of the group's keys, then a watch after it; every
//!   record (but this gateway's own, once running) goes to a [`LearnedSink`] — the daemon's
//!   engine, which applies its own policy and breakers. Deletes import nothing.
//!
//! The wall clock comes through [`Wall`] (records carry wall-clock milliseconds: monotonic
//! clocks differ between hosts); timers run on tokio's clock.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::error::StoreError;
use crate::keys::Layout;
use crate::store::{Event, LeaseId, Op, Revision, Store, Txn, Watch};

/// etcd's default `--max-txn-ops`: the most operations one transaction may carry.
pub const MAX_TXN_OPS: usize = 128;

/// What one gateway learned from one answer, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LearnedRecord {
    /// The canonical name asked.
    pub name: String,
    /// The client group (ClientGroup name) that asked.
    pub client: String,
    /// The addresses learned (sorted, distinct).
    pub addrs: Vec<IpAddr>,
    /// The TTL as held (the answer's, raised to the gateway's minimum).
    pub ttl: u32,
    /// Wall-clock milliseconds of the answer.
    pub learned_ms: u64,
    /// Wall-clock milliseconds when it expires (`learned_ms + ttl`).
    pub expires_ms: u64,
    /// The gateway that learned it.
    pub gateway: String,
}

/// A wall clock (Unix milliseconds).
pub trait Wall: Send + Sync + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn unix_ms(&self) -> u64;
}

/// Where imported records go: the daemon's engine.
pub trait LearnedSink: Send + Sync + 'static {
    /// Learns `records`; returns how many were imported (the rest were refused by the local
    /// policy or breakers, or named an unknown client group). Called from a blocking thread,
    /// one call at a time.
    fn import(&self, records: &[LearnedRecord]) -> usize;
}

/// How a gateway shares its answers.
#[derive(Debug, Clone)]
pub struct ShareConfig {
    /// This gateway's name.
    pub gateway: String,
    /// The group it shares with.
    pub group: String,
    /// The cluster's key layout.
    pub layout: Layout,
    /// How long a batch collects after its first answer.
    pub batch_delay: Duration,
    /// The width of an expiry bucket (one lease per bucket).
    pub bucket: Duration,
    /// The most keys waiting to be written (more are dropped and counted).
    pub max_pending: usize,
}

impl ShareConfig {
    /// The defaults of docs/ha-gateway.md: 5 ms batches, 30 s buckets, 65,536 pending keys.
    pub fn new(gateway: &str, group: &str, layout: Layout) -> Self {
        Self {
            gateway: gateway.to_owned(),
            group: group.to_owned(),
            layout,
            batch_delay: Duration::from_millis(5),
            bucket: Duration::from_secs(30),
            max_pending: 65_536,
        }
    }

    /// `<p>-learned/<group>/`: every record of the group.
    pub fn group_prefix(&self) -> String {
        format!("{}-learned/{}/", self.layout.prefix(), encode(&self.group))
    }

    /// The key of a record of this gateway.
    pub fn key(&self, client: &str, name: &str) -> String {
        format!(
            "{}{}/{}/{}",
            self.group_prefix(),
            encode(&self.gateway),
            encode(client),
            encode(name)
        )
    }
}

/// `s` with every byte outside `A-Z a-z 0-9 . _ -` as `%XX`.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What sharing reports (`fqdnd status`, metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareStatus {
    /// The group.
    pub group: String,
    /// Whether writes succeed: false from a failed write until one succeeds (a gateway that
    /// has nothing to write is not failing; [`ShareStatus::new`] starts it true).
    pub publishing: bool,
    /// Whether the import watch runs.
    pub importing: bool,
    /// Whether the first import (before serving) completed.
    pub initial_import_done: bool,
    /// Records written.
    pub published: u64,
    /// Transactions written.
    pub transactions: u64,
    /// Keys waiting to be written.
    pub pending: usize,
    /// Answers dropped (the pending set or the channel was full).
    pub dropped: u64,
    /// The last batch's publication lag (its oldest answer to the commit), in milliseconds.
    pub publish_lag_ms: u64,
    /// The largest publication lag seen, in milliseconds.
    pub publish_lag_max_ms: u64,
    /// Records imported into the engine.
    pub imported: u64,
    /// Records the engine refused (unknown client group, refused name, breakers, expired).
    pub import_refused: u64,
    /// The last import batch's lag (its oldest record's answer to the end of its import into
    /// the engine, wall clocks), in milliseconds.
    pub import_lag_ms: u64,
    /// The largest import lag seen, in milliseconds.
    pub import_lag_max_ms: u64,
    /// The last error.
    pub last_error: Option<String>,
}

impl ShareStatus {
    /// The status of a gateway of `group` that has not done anything yet.
    pub fn new(group: &str) -> Self {
        Self {
            group: group.to_owned(),
            publishing: true,
            ..Self::default()
        }
    }
}

/// An answer to publish, from the proxy's observer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The client group's name.
    pub client: String,
    /// The canonical name.
    pub name: String,
    /// The addresses learned.
    pub addrs: Vec<IpAddr>,
    /// The TTL as held.
    pub ttl: u32,
    /// Wall-clock milliseconds of the answer.
    pub learned_ms: u64,
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
            dropped: 0,
        }
    }

    /// Keys waiting to be written.
    pub fn pending(&self) -> usize {
        self.pending.len()
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

    /// Writes everything pending; returns (records written, transactions, the oldest
    /// written answer's wait). What could not be written stays pending.
    ///
    /// # Errors
    /// The store failed (what was written before stays written).
    pub async fn flush<S: Store>(
        &mut self,
        store: &S,
        now_ms: u64,
        now: Instant,
    ) -> Result<(u64, u64, Duration), StoreError> {
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs the publisher until `answers` closes or `stop`: batches of `batch_delay`, retried
/// with backoff while the store fails.
pub async fn publish<S: Store, W: Wall>(
    store: S,
    config: ShareConfig,
    wall: Arc<W>,
    mut answers: mpsc::Receiver<Answer>,
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
            answer = answers.recv() => match answer {
                Some(answer) => {
                    publisher.offer(answer, Instant::now());
                    // Whatever else is queued joins the batch now.
                    while let Ok(more) = answers.try_recv() {
                        publisher.offer(more, Instant::now());
                    }
                    if next.is_none() && publisher.pending() > 0 {
                        next = Some(Instant::now() + delay);
                    }
                    let (pending, dropped) = (publisher.pending(), publisher.dropped());
                    status.send_modify(|s| {
                        s.pending = pending;
                        s.dropped = s.dropped.max(dropped);
                    });
                }
                None => return,
            },
            () = timer => {
                match publisher.flush(&store, wall.unix_ms(), Instant::now()).await {
                    Ok((written, transactions, lag)) => {
                        backoff = Duration::from_millis(100);
                        next = (publisher.pending() > 0).then(|| Instant::now() + delay);
                        let pending = publisher.pending();
                        status.send_modify(|s| {
                            s.publishing = true;
                            s.published += written;
                            s.transactions += transactions;
                            s.pending = pending;
                            if written > 0 {
                                s.publish_lag_ms = millis(lag);
                                s.publish_lag_max_ms = s.publish_lag_max_ms.max(millis(lag));
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, pending = publisher.pending(), "publishing learned answers failed: retrying");
                        next = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                        let pending = publisher.pending();
                        status.send_modify(|s| {
                            s.publishing = false;
                            s.pending = pending;
                            s.last_error = Some(e.to_string());
                        });
                    }
                }
            }
            changed = stop.changed() => {
                // Stopped, or the daemon is gone.
                if changed.is_err() || *stop.borrow() {
                    if publisher.pending() > 0 {
                        let _ = publisher.flush(&store, wall.unix_ms(), Instant::now()).await;
                    }
                    return;
                }
            }
        }
    }
}

/// Decodes the records among `kvs`-like (key, value) pairs; undecodable values are skipped.
fn decode(key: &str, value: &[u8]) -> Option<LearnedRecord> {
    match serde_json::from_slice(value) {
        Ok(record) => Some(record),
        Err(e) => {
            tracing::warn!(key, error = %e, "a learned record does not parse: ignored");
            None
        }
    }
}

async fn deliver<K: LearnedSink, W: Wall>(
    sink: &Arc<K>,
    wall: &Arc<W>,
    records: Vec<LearnedRecord>,
    status: &watch::Sender<ShareStatus>,
) {
    if records.is_empty() {
        return;
    }
    let oldest = records.iter().map(|r| r.learned_ms).min().unwrap_or(0);
    let total = records.len() as u64;
    let sink = Arc::clone(sink);
    let imported = tokio::task::spawn_blocking(move || sink.import(&records))
        .await
        .unwrap_or(0) as u64;
    // Until the sink has them: the answer is enforced here from then on.
    let lag = wall.unix_ms().saturating_sub(oldest);
    status.send_modify(|s| {
        s.imported += imported;
        s.import_refused += total.saturating_sub(imported);
        s.import_lag_ms = lag;
        s.import_lag_max_ms = s.import_lag_max_ms.max(lag);
    });
}

/// Reads every record of the group and imports it (this gateway's own included: what it
/// learned before a restart). Returns the revision read at.
///
/// # Errors
/// The store failed.
pub async fn import_all<S: Store, K: LearnedSink, W: Wall>(
    store: &S,
    config: &ShareConfig,
    sink: &Arc<K>,
    wall: &Arc<W>,
    status: &watch::Sender<ShareStatus>,
) -> Result<Revision, StoreError> {
    let snapshot = store.range(&config.group_prefix()).await?;
    let now_ms = wall.unix_ms();
    let records: Vec<LearnedRecord> = snapshot
        .kvs
        .iter()
        .filter_map(|kv| decode(&kv.key, &kv.value))
        .filter(|r| r.expires_ms > now_ms)
        .collect();
    for chunk in records.chunks(1024) {
        deliver(sink, wall, chunk.to_vec(), status).await;
    }
    Ok(snapshot.revision)
}

/// Runs the importer until `stop`: from `revision` (what [`import_all`] read before serving;
/// `None`: read everything first), watching the group; on a store error it keeps what it
/// imported, backs off, and reads everything again.
pub async fn import<S: Store, K: LearnedSink, W: Wall>(
    store: S,
    config: ShareConfig,
    sink: Arc<K>,
    wall: Arc<W>,
    mut revision: Option<Revision>,
    status: watch::Sender<ShareStatus>,
    mut stop: watch::Receiver<bool>,
) {
    let prefix = config.group_prefix();
    let mut backoff = Duration::from_millis(200);
    loop {
        if *stop.borrow() {
            return;
        }
        let connected = async {
            let from = match revision {
                Some(r) => r,
                None => {
                    let r = import_all(&store, &config, &sink, &wall, &status).await?;
                    status.send_modify(|s| s.initial_import_done = true);
                    r
                }
            };
            let w = store.watch(&prefix, from + 1).await?;
            Ok::<_, StoreError>(w)
        }
        .await;
        let mut w = match connected {
            Ok(w) => w,
            Err(e) => {
                revision = None;
                status.send_modify(|s| {
                    s.importing = false;
                    s.last_error = Some(e.to_string());
                });
                crate::node::retry_pause(&mut backoff, &mut stop).await;
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        status.send_modify(|s| s.importing = true);
        let failure = loop {
            tokio::select! {
                next = w.next() => match next {
                    Ok(batch) => {
                        let records: Vec<LearnedRecord> = batch
                            .events
                            .iter()
                            .filter_map(|e| match e {
                                Event::Put(kv) => decode(&kv.key, &kv.value),
                                Event::Delete { .. } => None,
                            })
                            .filter(|r| r.gateway != config.gateway)
                            .collect();
                        deliver(&sink, &wall, records, &status).await;
                    }
                    Err(e) => break e,
                },
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        };
        tracing::warn!(error = %failure, "the learned-answer watch ended: keeping what was imported, reading the group again when the store is back");
        revision = None;
        status.send_modify(|s| {
            s.importing = false;
            s.last_error = Some(failure.to_string());
        });
    }
}
