//! The allocator as a service (`fqdnd operator`): any number may run, one leads.
//!
//! Each instance holds a lease (renewed every third of its TTL) and campaigns for the leader
//! key (`<p>/operator/leader`, created under the lease only if missing). The leader reads the
//! whole prefix, watches it, and runs the [`Allocator`]'s plans: creations batched into
//! transactions, GC on its own tick. Every write is fenced on the leader key's create
//! revision, so an instance that lost its lease (partitioned, paused) cannot write; it notices
//! (a failed keep-alive, a fenced transaction that fails) and campaigns again. When the leader
//! dies, its lease expires after the TTL and a waiting instance, watching the key, takes over.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::allocator::Allocator;
use crate::error::{Error, StoreError};
use crate::keys::Layout;
use crate::reject::RecordKind;
use crate::store::{Compare, Event, LeaseId, Op, Revision, Store, Txn, Watch};

/// How an allocator instance runs.
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// Its name (the leader key's value).
    pub name: String,
    /// The key layout.
    pub layout: Layout,
    /// Its lease's TTL: how long a dead leader keeps the key.
    pub lease_ttl: Duration,
    /// How long an identity must be unused before it is collected.
    pub gc_grace: Duration,
    /// How often collection is planned.
    pub gc_interval: Duration,
    /// Identities created per transaction at most.
    pub batch: usize,
}

impl OperatorConfig {
    /// The defaults for `name` under `layout`: 15 s lease, 10 min grace, GC every minute,
    /// 32 creations per transaction.
    pub fn new(name: String, layout: Layout) -> Self {
        Self {
            name,
            layout,
            lease_ttl: Duration::from_secs(15),
            gc_grace: Duration::from_secs(600),
            gc_interval: Duration::from_secs(60),
            batch: 32,
        }
    }
}

/// What an allocator instance reports (`fqdnd operator` logs it; tests read it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OperatorStatus {
    /// Whether this instance leads.
    pub leading: bool,
    /// The leader's name, as last seen.
    pub leader: Option<String>,
    /// Identities in the leader's view.
    pub identities: usize,
    /// Identities this instance created.
    pub created: u64,
    /// Identities this instance collected.
    pub collected: u64,
    /// Times this instance became the leader.
    pub terms: u64,
    /// The last error, if the last attempt failed.
    pub last_error: Option<String>,
    /// Whether the last call to the store succeeded (false from a failure until a success).
    pub connected: bool,
    /// Records the leader's view refused (not well formed, key and value disagreeing), by
    /// kind.
    pub rejected: BTreeMap<RecordKind, u64>,
    /// Identity numbers whose key is damaged: skipped by allocation.
    pub damaged_numbers: usize,
    /// Creations the store refused in a row (the view was stale); reset by a success.
    pub refused_creations: u64,
}

impl OperatorStatus {
    /// `leader`, `follower` or `unreachable`: this instance's state in one word.
    pub fn state(&self) -> &'static str {
        if !self.connected {
            "unreachable"
        } else if self.leading {
            "leader"
        } else {
            "follower"
        }
    }
}

/// Why leading stopped.
enum Ended {
    Stopped,
    Lost(String),
}

/// Runs an allocator instance until `stop` turns true; then it resigns (revokes its lease, so
/// another takes over at once).
///
/// # Errors
/// Only a name that cannot be a key; store failures are retried.
pub async fn run<S: Store>(
    store: S,
    config: OperatorConfig,
    status: watch::Sender<OperatorStatus>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    if !crate::keys::valid_name(&config.name) {
        return Err(Error::InvalidName { name: config.name });
    }
    let started = Instant::now();
    let retry = Duration::from_millis(500);
    loop {
        if *stop.borrow() {
            return Ok(());
        }
        let lease = match store.grant(config.lease_ttl).await {
            Ok(lease) => lease,
            Err(e) => {
                report_error(&status, &e.to_string());
                if wait(&mut stop, retry).await {
                    return Ok(());
                }
                continue;
            }
        };
        let (lost_tx, lost) = watch::channel(false);
        // Aborted with this future, however it ends (a dropped instance renews nothing).
        let keeper = AbortOnDrop(tokio::spawn(keep_alive(
            store.clone(),
            lease,
            config.lease_ttl,
            lost_tx,
        )));
        let ended =
            campaign_and_lead(&store, &config, lease, lost, &status, &mut stop, started).await;
        drop(keeper);
        status.send_modify(|s| s.leading = false);
        match ended {
            Ended::Stopped => {
                let _ = store.revoke(lease).await;
                tracing::info!(name = %config.name, "allocator stopped (lease revoked)");
                return Ok(());
            }
            Ended::Lost(why) => {
                tracing::warn!(name = %config.name, reason = %why, "allocator lost its lease or leadership; campaigning again");
                report_error(&status, &why);
                let _ = store.revoke(lease).await;
            }
        }
    }
}

/// Aborts its task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn report_error(status: &watch::Sender<OperatorStatus>, error: &str) {
    status.send_modify(|s| {
        s.last_error = Some(error.to_owned());
        s.connected = false;
    });
}

/// Notes that the store answered.
fn reached(status: &watch::Sender<OperatorStatus>) {
    status.send_if_modified(|s| {
        let changed = !s.connected;
        s.connected = true;
        changed
    });
}

/// Waits `d` or until stopped; true if stopped.
async fn wait(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}

/// Renews `lease` every third of its TTL; reports it lost when the store says it is gone, or
/// when no renewal succeeded for a whole TTL (it may have expired meanwhile).
pub(crate) async fn keep_alive<S: Store>(
    store: S,
    lease: LeaseId,
    ttl: Duration,
    lost: watch::Sender<bool>,
) {
    let mut last_ok = Instant::now();
    let period = (ttl / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(period).await;
        match store.keep_alive(lease).await {
            Ok(true) => last_ok = Instant::now(),
            Ok(false) => {
                let _ = lost.send(true);
                return;
            }
            Err(_) if last_ok.elapsed() >= ttl => {
                let _ = lost.send(true);
                return;
            }
            Err(_) => {}
        }
    }
}

async fn campaign_and_lead<S: Store>(
    store: &S,
    config: &OperatorConfig,
    lease: LeaseId,
    mut lost: watch::Receiver<bool>,
    status: &watch::Sender<OperatorStatus>,
    stop: &mut watch::Receiver<bool>,
    started: Instant,
) -> Ended {
    let leader_key = config.layout.leader();
    let retry = Duration::from_millis(300);
    // Campaign.
    let token = loop {
        if *stop.borrow() {
            return Ended::Stopped;
        }
        if *lost.borrow() {
            return Ended::Lost("lease lost while campaigning".to_owned());
        }
        let attempt = store
            .txn(Txn {
                compares: vec![Compare::missing(leader_key.clone())],
                ops: vec![Op::Put {
                    key: leader_key.clone(),
                    value: config.name.clone().into_bytes(),
                    lease: Some(lease),
                }],
            })
            .await;
        if attempt.is_ok() {
            reached(status);
        }
        match attempt {
            Ok(outcome) if outcome.succeeded => break outcome.revision,
            Ok(_) => {}
            Err(StoreError::LeaseNotFound { .. }) => {
                return Ended::Lost("lease expired while campaigning".to_owned());
            }
            Err(e) => {
                report_error(status, &e.to_string());
                if wait(stop, retry).await {
                    return Ended::Stopped;
                }
                continue;
            }
        }
        // Someone leads: wait for the key to go.
        match wait_for_deletion(store, &leader_key, status, &mut lost, stop).await {
            Some(ended) => return ended,
            None => continue,
        }
    };
    tracing::info!(name = %config.name, revision = token, "allocator leads");
    status.send_modify(|s| {
        s.leading = true;
        s.leader = Some(config.name.clone());
        s.terms += 1;
        s.last_error = None;
    });
    lead(store, config, token, &mut lost, status, stop, started).await
}

/// Waits until the leader key is deleted; `Some` if waiting ended otherwise.
async fn wait_for_deletion<S: Store>(
    store: &S,
    key: &str,
    status: &watch::Sender<OperatorStatus>,
    lost: &mut watch::Receiver<bool>,
    stop: &mut watch::Receiver<bool>,
) -> Option<Ended> {
    let snapshot = match store.range(key).await {
        Ok(s) => s,
        Err(e) => {
            report_error(status, &e.to_string());
            return wait(stop, Duration::from_millis(300))
                .await
                .then_some(Ended::Stopped);
        }
    };
    reached(status);
    // No leader key: campaign again at once.
    let current = snapshot.kvs.iter().find(|kv| kv.key == key)?;
    let holder = String::from_utf8_lossy(&current.value).into_owned();
    status.send_modify(|s| s.leader = Some(holder));
    let mut w = match store.watch(key, snapshot.revision + 1).await {
        Ok(w) => w,
        Err(e) => {
            report_error(status, &e.to_string());
            return wait(stop, Duration::from_millis(300))
                .await
                .then_some(Ended::Stopped);
        }
    };
    loop {
        tokio::select! {
            batch = w.next() => match batch {
                Ok(batch) => {
                    if batch.events.iter().any(|e| e.key() == key && matches!(e, Event::Delete { .. })) {
                        return None;
                    }
                }
                Err(e) => {
                    report_error(status, &e.to_string());
                    return wait(stop, Duration::from_millis(300)).await.then_some(Ended::Stopped);
                }
            },
            _ = lost.changed() => return Some(Ended::Lost("lease lost while waiting".to_owned())),
            _ = stop.changed() => return Some(Ended::Stopped),
        }
    }
}

async fn lead<S: Store>(
    store: &S,
    config: &OperatorConfig,
    token: Revision,
    lost: &mut watch::Receiver<bool>,
    status: &watch::Sender<OperatorStatus>,
    stop: &mut watch::Receiver<bool>,
    started: Instant,
) -> Ended {
    let root = config.layout.root();
    let now = || started.elapsed();
    let mut alloc = Allocator::new(config.layout.clone());
    let mut batch = config.batch.max(1);
    'view: loop {
        if *stop.borrow() {
            return Ended::Stopped;
        }
        let snapshot = match store.range(&root).await {
            Ok(s) => s,
            Err(e) => {
                report_error(status, &e.to_string());
                if wait(stop, Duration::from_millis(300)).await {
                    return Ended::Stopped;
                }
                if *lost.borrow() {
                    return Ended::Lost("lease lost while the store was unreachable".to_owned());
                }
                continue;
            }
        };
        reached(status);
        alloc.load(&snapshot, now());
        let mut w = match store.watch(&root, snapshot.revision + 1).await {
            Ok(w) => w,
            Err(e) => {
                report_error(status, &e.to_string());
                continue;
            }
        };
        let mut gc = tokio::time::interval(config.gc_interval);
        gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retry_at: Option<Instant> = None;
        loop {
            status.send_modify(|s| {
                s.identities = alloc.identities();
                s.leader = Some(config.name.clone());
                s.rejected.clone_from(alloc.rejections().counts());
                s.damaged_numbers = alloc.damaged_numbers();
            });
            if retry_at.is_none_or(|at| Instant::now() >= at) {
                retry_at = None;
                let create = alloc.plan_create(batch);
                if !create.is_empty() {
                    match store.txn(alloc.create_txn(&create, token)).await {
                        Ok(outcome) if outcome.succeeded => {
                            alloc.created(&create, outcome.revision, now());
                            status.send_modify(|s| {
                                s.created += create.len() as u64;
                                s.refused_creations = 0;
                            });
                            for (labels, id) in &create {
                                tracing::info!(identity = id, labels = %labels, "identity created");
                            }
                            batch = config.batch.max(1);
                            continue;
                        }
                        Ok(_) => {
                            if !still_leader(store, &config.layout.leader(), token).await {
                                return Ended::Lost(
                                    "another allocator holds the leader key".to_owned(),
                                );
                            }
                            // Our view was stale (a key exists): read it again — at once the
                            // first time, then with a pause, so that a key the view cannot
                            // account for never turns into a loop of reads and refusals.
                            let mut refused = 0;
                            status.send_modify(|s| {
                                s.refused_creations += 1;
                                refused = s.refused_creations;
                            });
                            if refused > 1 {
                                if refused.is_power_of_two() {
                                    tracing::warn!(
                                        refused,
                                        "identity creation refused by the store again; reading the view again after a pause"
                                    );
                                }
                                if wait(stop, Duration::from_millis(500)).await {
                                    return Ended::Stopped;
                                }
                            }
                            continue 'view;
                        }
                        Err(StoreError::Refused { reason }) if batch > 1 => {
                            tracing::warn!(%reason, batch, "identity creation refused; smaller batches");
                            batch = (batch / 2).max(1);
                            continue;
                        }
                        Err(e) => {
                            report_error(status, &e.to_string());
                            retry_at = Some(Instant::now() + Duration::from_millis(300));
                        }
                    }
                }
            }
            let sleep_until =
                retry_at.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                next = w.next() => match next {
                    Ok(b) => alloc.apply(&b.events, now()),
                    Err(StoreError::Compacted { .. }) => continue 'view,
                    Err(e) => {
                        report_error(status, &e.to_string());
                        if wait(stop, Duration::from_millis(300)).await {
                            return Ended::Stopped;
                        }
                        continue 'view;
                    }
                },
                _ = gc.tick() => {
                    let plan = alloc.plan(now(), config.gc_grace, 0);
                    for (id, labels) in plan.collect {
                        let Some(txn) = alloc.gc_txn(id, &labels, token) else { continue };
                        match store.txn(txn).await {
                            Ok(outcome) if outcome.succeeded => {
                                alloc.collected(id, &labels);
                                status.send_modify(|s| s.collected += 1);
                                tracing::info!(identity = id, labels = %labels, "unused identity collected");
                            }
                            Ok(_) => {
                                if !still_leader(store, &config.layout.leader(), token).await {
                                    return Ended::Lost("another allocator holds the leader key".to_owned());
                                }
                            }
                            Err(e) => {
                                report_error(status, &e.to_string());
                                break;
                            }
                        }
                    }
                },
                () = tokio::time::sleep_until(sleep_until) => {},
                _ = lost.changed() => return Ended::Lost("lease lost".to_owned()),
                _ = stop.changed() => return Ended::Stopped,
            }
        }
    }
}

async fn still_leader<S: Store>(store: &S, key: &str, token: Revision) -> bool {
    match store.range(key).await {
        Ok(snapshot) => snapshot
            .kvs
            .iter()
            .any(|kv| kv.key == key && kv.create_revision == token),
        // Unknown: keep leading; the fence protects every write, the keep-alive decides.
        Err(_) => true,
    }
}
