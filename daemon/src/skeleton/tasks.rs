//! The daemon's periodic tasks: DNS GC (with conntrack when there is a kernel side), the
//! node's addresses (the host identity) and metrics sampling. Each stops when the stop channel fires.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::Result;
use fqdnd_engine::Clock as _;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{Shared, lock};

/// How many metric ticks (seconds) between two walks of the conntrack map.
const CONNTRACK_SAMPLE_TICKS: u64 = 10;

/// Runs a GC pass every `interval`, then the journal's periodic work (compaction, the end of
/// the restore's grace period).
pub(super) fn spawn_gc(
    tasks: &mut JoinSet<Result<()>>,
    stopped: &watch::Receiver<bool>,
    shared: &Arc<Shared>,
    interval: Duration,
) {
    let shared = Arc::clone(shared);
    let mut stopped = stopped.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    gc(&shared);
                    if let Some(p) = &shared.persist {
                        p.tick(&shared.engine).await;
                    }
                }
                _ = stopped.changed() => return Ok(()),
            }
        }
    });
}

/// One GC pass. With a kernel, conntrack says which destinations are still in use — a flow
/// to them is alive (not past the lifetime of its state) — and zombies stay for them; the
/// dead conntrack entries go afterwards. Without a kernel nothing is in use.
fn gc(shared: &Shared) {
    let live = match &shared.kernel {
        None => HashSet::new(),
        Some(k) => match lock(k, "kernel").and_then(|k| k.live_destinations()) {
            Ok(live) => live,
            Err(e) => {
                // Without conntrack every expired IP would look unused: keep them this round.
                tracing::warn!(error = %crate::chain(&e), "reading conntrack failed; GC skipped");
                return;
            }
        },
    };
    if let Ok(mut engine) = shared.engine.lock() {
        let in_use = |ip: IpAddr| live.contains(&ip);
        match engine.gc(shared.clock.now(), &in_use) {
            Ok(stats) if stats.released > 0 => {
                tracing::debug!(
                    expired = stats.expired,
                    released = stats.released,
                    in_use = live.len(),
                    "dns gc"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %fqdnd_engine::error_chain(&e), "dns gc failed"),
        }
    }
    if let Some(k) = &shared.kernel {
        match lock(k, "kernel").and_then(|mut k| k.gc_conntrack()) {
            Ok(0) => {}
            Ok(n) => tracing::debug!(removed = n, "conntrack gc"),
            Err(e) => tracing::warn!(error = %crate::chain(&e), "conntrack gc failed"),
        }
    }
}

/// How often the node's addresses are read again (an address added or removed between two
/// reads is the host, or no longer, from the next one).
const HOST_ADDRESSES_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps the host identity on the node's current addresses (modes that give one).
pub(super) fn spawn_host_addresses(
    tasks: &mut JoinSet<Result<()>>,
    stopped: &watch::Receiver<bool>,
    shared: &Arc<Shared>,
) {
    if shared.mode.host_addresses().is_none() {
        return;
    }
    let shared = Arc::clone(shared);
    let mut stopped = stopped.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(HOST_ADDRESSES_INTERVAL);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Ok(mut engine) = shared.engine.lock() {
                        shared.refresh_host(&mut engine);
                    }
                }
                _ = stopped.changed() => return Ok(()),
            }
        }
    });
}

/// Samples the engine's and the journal's state into metrics once a second, and the conntrack
/// map's occupancy every 10 s (a walk of the whole map).
pub(super) fn spawn_metrics(
    tasks: &mut JoinSet<Result<()>>,
    stopped: &watch::Receiver<bool>,
    shared: &Arc<Shared>,
) {
    let shared = Arc::clone(shared);
    let mut stopped = stopped.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut ticks: u64 = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Ok(engine) = shared.engine.lock() {
                        crate::metrics::record_engine(&engine);
                    }
                    if let Some(p) = &shared.persist {
                        crate::metrics::record_journal(p);
                    }
                    if let Some(cluster) = &shared.cluster
                        && let Ok(engine) = shared.engine.lock()
                    {
                        crate::metrics::record_cluster(&cluster.status(&engine));
                    }
                    if let Some(kernel) = &shared.kernel
                        && ticks.is_multiple_of(CONNTRACK_SAMPLE_TICKS)
                    {
                        let occupancy = lock(kernel, "kernel")
                            .and_then(|k| Ok((k.conntrack_entries()?, k.sizes().conntrack)));
                        match occupancy {
                            Ok((entries, capacity)) => crate::metrics::record_conntrack(entries, capacity),
                            Err(e) => tracing::debug!(error = %crate::chain(&e), "reading conntrack occupancy failed"),
                        }
                    }
                    ticks += 1;
                }
                _ = stopped.changed() => return Ok(()),
            }
        }
    });
}
