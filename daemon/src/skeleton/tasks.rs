//! The daemon's periodic tasks: DNS GC (with conntrack when there is a kernel side), the
//! node's addresses (the host identity) and metrics sampling. Each stops when the stop channel
//! fires.
//!
//! Walks of the conntrack map (up to millions of entries) run on tokio's blocking pool, on a
//! handle of their own ([`fqdnd_ebpf::Conntrack`]): never on a runtime thread, never under the
//! kernel's lock that endpoint changes take.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::Result;
use fqdnd_ebpf::Conntrack;
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
) -> Result<()> {
    let shared = Arc::clone(shared);
    let mut conntrack = own_conntrack(&shared)?;
    let mut stopped = stopped.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    conntrack = gc(&shared, conntrack).await;
                    if let Some(p) = &shared.persist {
                        p.tick(&shared.engine).await;
                    }
                }
                _ = stopped.changed() => return Ok(()),
            }
        }
    });
    Ok(())
}

/// The conntrack map on a handle of the task's own, when there is a kernel side.
fn own_conntrack(shared: &Shared) -> Result<Option<Conntrack>> {
    match &shared.kernel {
        None => Ok(None),
        Some(k) => Ok(Some(lock(k, "kernel")?.conntrack()?)),
    }
}

/// `walk` on the blocking pool; the handle comes back with its result.
async fn off_runtime<T: Send + 'static>(
    mut conntrack: Conntrack,
    walk: impl FnOnce(&mut Conntrack) -> std::result::Result<T, fqdnd_ebpf::Error> + Send + 'static,
) -> Result<(Conntrack, std::result::Result<T, fqdnd_ebpf::Error>)> {
    let back = tokio::task::spawn_blocking(move || {
        let result = walk(&mut conntrack);
        (conntrack, result)
    })
    .await?;
    Ok(back)
}

/// One GC pass. With a kernel, conntrack says which destinations are still in use — a flow
/// to them is alive (not past the lifetime of its state) — and zombies stay for them; the
/// dead conntrack entries go afterwards. Without a kernel nothing is in use.
async fn gc(shared: &Shared, conntrack: Option<Conntrack>) -> Option<Conntrack> {
    let (conntrack, live) = match conntrack {
        None => (None, HashSet::new()),
        Some(ct) => match off_runtime(ct, |ct| ct.live_destinations()).await {
            Ok((ct, Ok(live))) => (Some(ct), live),
            Ok((ct, Err(e))) => {
                // Without conntrack every expired IP would look unused: keep them this round.
                tracing::warn!(error = %crate::chain(&e), "reading conntrack failed; GC skipped");
                return Some(ct);
            }
            Err(e) => {
                tracing::error!(error = %crate::chain(&e), "the conntrack walk panicked; conntrack GC stops");
                return None;
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
    let ct = conntrack?;
    match off_runtime(ct, Conntrack::gc).await {
        Ok((ct, removed)) => {
            match removed {
                Ok(0) => {}
                Ok(n) => tracing::debug!(removed = n, "conntrack gc"),
                Err(e) => tracing::warn!(error = %crate::chain(&e), "conntrack gc failed"),
            }
            Some(ct)
        }
        Err(e) => {
            tracing::error!(error = %crate::chain(&e), "the conntrack walk panicked; conntrack GC stops");
            None
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
) -> Result<()> {
    let shared = Arc::clone(shared);
    let mut conntrack = own_conntrack(&shared)?;
    let capacity = match &shared.kernel {
        Some(k) => lock(k, "kernel")?.sizes().conntrack,
        None => 0,
    };
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
                    if ticks.is_multiple_of(CONNTRACK_SAMPLE_TICKS)
                        && let Some(ct) = conntrack.take()
                    {
                        match off_runtime(ct, |ct| ct.entries().map(|e| e.len())).await {
                            Ok((ct, occupancy)) => {
                                match occupancy {
                                    Ok(entries) => crate::metrics::record_conntrack(entries, capacity),
                                    Err(e) => tracing::debug!(error = %crate::chain(&e), "reading conntrack occupancy failed"),
                                }
                                conntrack = Some(ct);
                            }
                            Err(e) => tracing::error!(error = %crate::chain(&e), "the conntrack walk panicked; its sampling stops"),
                        }
                    }
                    ticks += 1;
                }
                _ = stopped.changed() => return Ok(()),
            }
        }
    });
    Ok(())
}
