//! Prometheus metrics: the recorder, its endpoint, and the engine's gauges sampled once a
//! second. The DNS proxy records its counters and gauges through the same `metrics` facade
//! and keeps its latency summaries itself; the endpoint serves both. Every series is in
//! [`catalogue`].

pub mod catalogue;

use std::net::SocketAddr;

use crate::{Context, Result};
use catalogue::*;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The `/metrics` endpoint: its socket, bound, and the recorder's handle.
pub struct Exporter {
    listener: std::net::TcpListener,
    handle: PrometheusHandle,
}

/// Installs the recorder and binds `/metrics` on `addr`; the returned exporter serves it once
/// spawned (the daemon spawns it when the restore has set the gauges: a scrape during the
/// restore waits, it never reads an empty page).
pub fn install(addr: SocketAddr) -> Result<Exporter> {
    recorder(addr, served())
}

/// `fqdnd operator`'s recorder, serving `/metrics` on `addr` once spawned.
pub fn install_operator(addr: SocketAddr) -> Result<Exporter> {
    let exporter = recorder(addr, OPERATOR)?;
    record_operator(&fqdnd_cluster::operator::OperatorStatus::default());
    Ok(exporter)
}

/// The process's recorder, with `catalogue` described, and its endpoint bound on `addr`.
fn recorder<'a>(
    addr: SocketAddr,
    catalogue: impl IntoIterator<Item = &'a fqdnd_dnsproxy::metrics::Series>,
) -> Result<Exporter> {
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .with_context(|| format!("serving Prometheus metrics on {addr}"))?;
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|_| crate::refused!("a metrics recorder is installed already"))?;
    fqdnd_dnsproxy::metrics::describe(catalogue);
    Ok(Exporter { listener, handle })
}

/// The operator's state into its metrics.
pub fn record_operator(s: &fqdnd_cluster::operator::OperatorStatus) {
    let now = s.state();
    for state in ["leader", "follower", "unreachable"] {
        metrics::gauge!(OPERATOR_STATE, "state" => state).set(if state == now { 1.0 } else { 0.0 });
    }
    metrics::gauge!(OPERATOR_IDENTITIES).set(s.identities as f64);
    metrics::counter!(OPERATOR_CREATED).absolute(s.created);
    metrics::counter!(OPERATOR_COLLECTED).absolute(s.collected);
    metrics::gauge!(OPERATOR_DAMAGED).set(s.damaged_numbers as f64);
    for (kind, n) in &s.rejected {
        metrics::counter!(CLUSTER_REJECTED, "kind" => kind.as_str()).absolute(*n);
    }
}

/// The page: the recorder's series, then the DNS proxy's latency summaries (which it keeps
/// itself: recording them through the exporter cost 3–17 % of the CPU per query).
fn page(handle: &PrometheusHandle) -> String {
    let mut text = handle.render();
    fqdnd_dnsproxy::metrics::render_summaries(&mut text);
    text
}

/// Serves `/metrics` from now on (any path answers with the page, as the exporter's own
/// listener did).
pub fn serve(exporter: Exporter) {
    let Exporter { listener, handle } = exporter;
    // The exporter folds what histograms record through the facade into their summaries at
    // its upkeep; none does today, and the upkeep keeps it so if one is added.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(error = %e, "the metrics endpoint did not start");
                return;
            }
        };
        let app = axum::Router::new().fallback(move || {
            let text = page(&handle);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    text,
                )
            }
        });
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    });
}

/// Samples the engine's state into gauges (once a second, and right after a restore).
pub fn record_engine<D>(engine: &fqdnd_engine::Engine<D>) {
    let counts = engine.counts();
    metrics::gauge!(IDENTITIES).set(counts.identities as f64);
    metrics::gauge!(FQDN_IDENTITIES).set(counts.fqdn_identities as f64);
    metrics::gauge!(CACHE_NAMES).set(counts.cache_names as f64);
    metrics::gauge!(CACHE_ENTRIES).set(counts.cache_entries as f64);
    metrics::gauge!(CACHE_ZOMBIES).set(counts.cache_zombies as f64);
    metrics::gauge!(IPCACHE_PREFIXES).set(counts.ipcache_prefixes as f64);
    metrics::gauge!(CACHE_ENTRIES_MAX).set(counts.cache_entries_max as f64);
    let trips = engine.names.stats().trips;
    for (breaker, n) in [
        ("names_per_endpoint", trips.names_per_endpoint),
        ("ips_per_name", trips.ips_per_name),
        ("cache_entries", trips.cache_entries),
        ("fqdn_identities", engine.ipcache.stats().breaker_trips),
    ] {
        metrics::counter!(BREAKER_TRIPS, "breaker" => breaker).absolute(n);
    }
    if let Some(room) = engine.ipcache.datapath_room() {
        let [v4, v6] = engine.ipcache.datapath_prefixes();
        for (map, n) in [("ipcache4", v4), ("ipcache6", v6)] {
            metrics::gauge!(MAP_ENTRIES, "map" => map).set(n as f64);
            metrics::gauge!(MAP_CAPACITY, "map" => map).set(room as f64);
        }
        metrics::counter!(MAP_FULL, "map" => "ipcache")
            .absolute(engine.ipcache.stats().datapath_full);
    }
}

/// Failed writes of other state files (the services' snapshot), counted with the journal's.
static STATE_FILE_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts a state file that could not be written (in `fqdnd_checkpoint_errors_total`).
pub fn count_state_file_error() {
    STATE_FILE_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Publishes the journal's counters.
pub fn record_journal(persist: &fqdnd_engine::durable::Persist) {
    let s = persist.journal_stats();
    metrics::counter!(CHECKPOINT_RECORDS).absolute(s.records);
    metrics::counter!(CHECKPOINT_FSYNCS).absolute(s.fsyncs);
    metrics::counter!(CHECKPOINT_BYTES).absolute(s.bytes);
    metrics::counter!(CHECKPOINT_FAILED_BATCHES).absolute(s.failed_batches);
    for (count, bound) in s
        .slow_batches
        .iter()
        .zip(fqdnd_checkpoint::SLOW_BATCH_BOUNDS)
    {
        let over = format!("{}ms", bound.as_millis());
        metrics::counter!(CHECKPOINT_SLOW_BATCHES, "over" => over).absolute(*count);
    }
    let others = STATE_FILE_ERRORS.load(std::sync::atomic::Ordering::Relaxed);
    metrics::counter!(CHECKPOINT_ERRORS).absolute(persist.errors() + others);
    metrics::gauge!(CHECKPOINT_LAST_BATCH_RECORDS).set(s.last_batch_records as f64);
    metrics::gauge!(CHECKPOINT_LAST_FSYNC).set(s.last_fsync.as_secs_f64());
    metrics::gauge!(CHECKPOINT_QUEUED_BYTES).set(s.queued_bytes as f64);
    metrics::gauge!(CHECKPOINT_NAMES_IN_DOUBT).set(persist.names_in_doubt() as f64);
}

/// Counts a kernel map that refused a write (`fqdnd_datapath_map_full_total{map}`), if that is
/// what `e` (or one of its causes) is.
pub fn record_datapath_error(e: &(dyn std::error::Error + 'static)) {
    let mut cause = Some(e);
    while let Some(c) = cause {
        let full = match c.downcast_ref::<fqdnd_ipcache::Error>() {
            Some(fqdnd_ipcache::Error::Datapath(fqdnd_ipcache::DatapathError::MapFull { map })) => {
                Some(*map)
            }
            _ => match c.downcast_ref::<fqdnd_ipcache::DatapathError>() {
                Some(fqdnd_ipcache::DatapathError::MapFull { map }) => Some(*map),
                _ => None,
            },
        };
        if let Some(map) = full {
            metrics::counter!(MAP_FULL, "map" => map).increment(1);
            return;
        }
        cause = c.source();
    }
}

/// Conntrack occupancy: entries now (a walk of the LRU map) against its size.
pub fn record_conntrack(entries: usize, capacity: u32) {
    metrics::gauge!(MAP_ENTRIES, "map" => "conntrack").set(entries as f64);
    metrics::gauge!(MAP_CAPACITY, "map" => "conntrack").set(f64::from(capacity));
}

/// Cluster mode's gauges, from `fqdnd status`'s cluster section.
pub fn record_cluster(status: &crate::cluster::ClusterStatus) {
    metrics::gauge!(CLUSTER_CONNECTED).set(if status.connected { 1.0 } else { 0.0 });
    metrics::gauge!(CLUSTER_TEMPORARY_IDENTITIES).set(status.temporary_identities.len() as f64);
    metrics::gauge!(CLUSTER_REMOTE_ENDPOINTS).set(status.remote_endpoints as f64);
    metrics::gauge!(CLUSTER_IDENTITIES).set(status.identities as f64);
    for (kind, n) in &status.rejected {
        metrics::counter!(CLUSTER_REJECTED, "kind" => kind.clone()).absolute(*n);
    }
    if let Some(h) = &status.ha {
        metrics::gauge!(HA_PUBLISH_LAG).set(h.publish_lag_ms as f64 / 1000.0);
        metrics::gauge!(HA_IMPORT_LAG).set(h.import_lag_ms as f64 / 1000.0);
        metrics::gauge!(HA_PENDING).set(h.pending as f64);
        metrics::counter!(HA_PUBLISHED).absolute(h.published);
        metrics::counter!(HA_IMPORTED).absolute(h.imported);
        metrics::counter!(HA_IMPORT_REFUSED).absolute(h.import_refused);
        metrics::counter!(HA_DROPPED).absolute(h.dropped);
        metrics::counter!(HA_REVOKED).absolute(h.revoked);
        metrics::counter!(HA_REPUBLISHED).absolute(h.republished);
        metrics::gauge!(HA_STARTUP_IMPORT).set(h.startup_import_ms as f64 / 1000.0);
    }
}
