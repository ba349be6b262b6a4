//! Prometheus metrics: the recorder, and the engine's gauges sampled once a second. The DNS
//! proxy records its own counters and histograms through the same `metrics` facade.

use std::net::SocketAddr;

use crate::{Context, Result};
use metrics_exporter_prometheus::{ExporterFuture, PrometheusBuilder};

/// Installs the recorder and binds `/metrics` on `addr`; the returned exporter serves it once
/// spawned (the daemon spawns it when the restore has set the gauges: a scrape during the
/// restore waits, it never reads an empty page).
pub fn install(addr: SocketAddr) -> Result<ExporterFuture> {
    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(addr)
        .build()
        .with_context(|| format!("serving Prometheus metrics on {addr}"))?;
    metrics::set_global_recorder(recorder)
        .map_err(|_| crate::refused!("a metrics recorder is installed already"))?;
    metrics::describe_gauge!("fqdnd_identities", "identities allocated (all scopes)");
    metrics::describe_gauge!(
        "fqdnd_cluster_connected",
        "cluster mode: 1 while the node side reaches etcd"
    );
    metrics::describe_gauge!(
        "fqdnd_cluster_temporary_identities",
        "cluster mode: local label sets waiting for their global identity"
    );
    metrics::describe_gauge!(
        "fqdnd_cluster_remote_endpoints",
        "cluster mode: other nodes' endpoints known"
    );
    metrics::describe_gauge!(
        "fqdnd_cluster_identities",
        "cluster mode: global identities known"
    );
    metrics::describe_counter!(
        "fqdnd_cluster_records_rejected_total",
        "cluster mode: records in etcd refused as read (not well formed, key and value disagreeing, out of range; policy_document: a shared policy that does not load), by kind"
    );
    metrics::describe_gauge!(
        "fqdnd_fqdn_identities",
        "identities created by DNS answers (the breaker's count)"
    );
    metrics::describe_gauge!("fqdnd_cache_names", "names in the DNS cache");
    metrics::describe_gauge!(
        "fqdnd_cache_entries",
        "(name, IP) mappings in the DNS cache, zombies included"
    );
    metrics::describe_gauge!(
        "fqdnd_cache_zombies",
        "expired or evicted IPs kept while in use"
    );
    metrics::describe_gauge!(
        "fqdnd_ipcache_prefixes",
        "prefixes with metadata in the IpCache"
    );
    metrics::describe_counter!(
        "fqdnd_breaker_trips_total",
        "DNS-driven changes a circuit breaker rejected, by breaker"
    );
    metrics::describe_gauge!(
        "fqdnd_cache_entries_max",
        "the bound on (name, IP) mappings in the DNS cache (breakers.maxCacheEntries)"
    );
    metrics::describe_counter!(
        "fqdnd_datapath_map_full_total",
        "DNS-driven changes refused because a datapath map had no room, by map"
    );
    metrics::describe_gauge!(
        "fqdnd_datapath_map_entries",
        "entries in a kernel map (ipcache4/ipcache6 as written, conntrack sampled every 10 s)"
    );
    metrics::describe_gauge!("fqdnd_datapath_map_capacity", "size of a kernel map");
    metrics::describe_counter!(
        "fqdnd_querylog_dropped_total",
        "query-log records dropped because the writer fell behind"
    );
    metrics::describe_gauge!(
        "fqdnd_ha_publish_lag_seconds",
        "HA gateway group: the last batch's wait from its oldest answer to its etcd commit"
    );
    metrics::describe_gauge!(
        "fqdnd_ha_import_lag_seconds",
        "HA gateway group: the last import of new records, from the oldest one's answer (peer's wall clock) to its import (the import at start is apart: fqdnd_ha_startup_import_seconds)"
    );
    metrics::describe_gauge!(
        "fqdnd_ha_pending",
        "HA gateway group: learned answers waiting to be written to etcd"
    );
    metrics::describe_gauge!(
        "fqdnd_ha_startup_import_seconds",
        "HA gateway group: how long the import of the group's state at start took"
    );
    Ok(exporter)
}

/// `fqdnd operator`'s recorder, serving `/metrics` on `addr` once spawned.
pub fn install_operator(addr: SocketAddr) -> Result<ExporterFuture> {
    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(addr)
        .build()
        .with_context(|| format!("serving Prometheus metrics on {addr}"))?;
    metrics::set_global_recorder(recorder)
        .map_err(|_| crate::refused!("a metrics recorder is installed already"))?;
    metrics::describe_gauge!(
        "fqdnd_operator_state",
        "operator: 1 for its state (leader, follower, unreachable), 0 for the others"
    );
    metrics::describe_gauge!(
        "fqdnd_operator_identities",
        "operator: global identities in the leader's view"
    );
    metrics::describe_counter!(
        "fqdnd_operator_identities_created_total",
        "operator: identities this instance created"
    );
    metrics::describe_counter!(
        "fqdnd_operator_identities_collected_total",
        "operator: unused identities this instance collected"
    );
    metrics::describe_gauge!(
        "fqdnd_operator_damaged_numbers",
        "operator: identity numbers whose key does not parse (skipped by allocation)"
    );
    metrics::describe_counter!(
        "fqdnd_cluster_records_rejected_total",
        "records in etcd refused as read, by kind"
    );
    record_operator(&fqdnd_cluster::operator::OperatorStatus::default());
    Ok(exporter)
}

/// The operator's state into its metrics.
pub fn record_operator(s: &fqdnd_cluster::operator::OperatorStatus) {
    let now = s.state();
    for state in ["leader", "follower", "unreachable"] {
        metrics::gauge!("fqdnd_operator_state", "state" => state).set(if state == now {
            1.0
        } else {
            0.0
        });
    }
    metrics::gauge!("fqdnd_operator_identities").set(s.identities as f64);
    metrics::counter!("fqdnd_operator_identities_created_total").absolute(s.created);
    metrics::counter!("fqdnd_operator_identities_collected_total").absolute(s.collected);
    metrics::gauge!("fqdnd_operator_damaged_numbers").set(s.damaged_numbers as f64);
    for (kind, n) in &s.rejected {
        metrics::counter!("fqdnd_cluster_records_rejected_total", "kind" => kind.as_str())
            .absolute(*n);
    }
}

/// Serves `/metrics` from now on.
pub fn serve(exporter: ExporterFuture) {
    tokio::spawn(async move {
        if let Err(e) = exporter.await {
            tracing::error!(error = ?e, "the metrics endpoint stopped");
        }
    });
}

/// Samples the engine's state into gauges (once a second, and right after a restore).
pub fn record_engine<D>(engine: &fqdnd_engine::Engine<D>) {
    let counts = engine.counts();
    metrics::gauge!("fqdnd_identities").set(counts.identities as f64);
    metrics::gauge!("fqdnd_fqdn_identities").set(counts.fqdn_identities as f64);
    metrics::gauge!("fqdnd_cache_names").set(counts.cache_names as f64);
    metrics::gauge!("fqdnd_cache_entries").set(counts.cache_entries as f64);
    metrics::gauge!("fqdnd_cache_zombies").set(counts.cache_zombies as f64);
    metrics::gauge!("fqdnd_ipcache_prefixes").set(counts.ipcache_prefixes as f64);
    metrics::gauge!("fqdnd_cache_entries_max").set(counts.cache_entries_max as f64);
    let trips = engine.names.stats().trips;
    for (breaker, n) in [
        ("names_per_endpoint", trips.names_per_endpoint),
        ("ips_per_name", trips.ips_per_name),
        ("cache_entries", trips.cache_entries),
        ("fqdn_identities", engine.ipcache.stats().breaker_trips),
    ] {
        metrics::counter!("fqdnd_breaker_trips_total", "breaker" => breaker).absolute(n);
    }
    if let Some(room) = engine.ipcache.datapath_room() {
        let [v4, v6] = engine.ipcache.datapath_prefixes();
        for (map, n) in [("ipcache4", v4), ("ipcache6", v6)] {
            metrics::gauge!("fqdnd_datapath_map_entries", "map" => map).set(n as f64);
            metrics::gauge!("fqdnd_datapath_map_capacity", "map" => map).set(room as f64);
        }
        metrics::counter!("fqdnd_datapath_map_full_total", "map" => "ipcache")
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
    metrics::counter!("fqdnd_checkpoint_records_total").absolute(s.records);
    metrics::counter!("fqdnd_checkpoint_fsyncs_total").absolute(s.fsyncs);
    metrics::counter!("fqdnd_checkpoint_bytes_total").absolute(s.bytes);
    metrics::counter!("fqdnd_checkpoint_failed_batches_total").absolute(s.failed_batches);
    for (count, bound) in s
        .slow_batches
        .iter()
        .zip(fqdnd_checkpoint::SLOW_BATCH_BOUNDS)
    {
        let over = format!("{}ms", bound.as_millis());
        metrics::counter!("fqdnd_checkpoint_slow_batches_total", "over" => over).absolute(*count);
    }
    let others = STATE_FILE_ERRORS.load(std::sync::atomic::Ordering::Relaxed);
    metrics::counter!("fqdnd_checkpoint_errors_total").absolute(persist.errors() + others);
    metrics::gauge!("fqdnd_checkpoint_last_batch_records").set(s.last_batch_records as f64);
    metrics::gauge!("fqdnd_checkpoint_last_fsync_seconds").set(s.last_fsync.as_secs_f64());
    metrics::gauge!("fqdnd_checkpoint_queued_bytes").set(s.queued_bytes as f64);
    metrics::gauge!("fqdnd_checkpoint_names_in_doubt").set(persist.names_in_doubt() as f64);
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
            metrics::counter!("fqdnd_datapath_map_full_total", "map" => map).increment(1);
            return;
        }
        cause = c.source();
    }
}

/// Conntrack occupancy: entries now (a walk of the LRU map) against its size.
pub fn record_conntrack(entries: usize, capacity: u32) {
    metrics::gauge!("fqdnd_datapath_map_entries", "map" => "conntrack").set(entries as f64);
    metrics::gauge!("fqdnd_datapath_map_capacity", "map" => "conntrack").set(f64::from(capacity));
}

/// Cluster mode's gauges, from `fqdnd status`'s cluster section.
pub fn record_cluster(status: &crate::cluster::ClusterStatus) {
    metrics::gauge!("fqdnd_cluster_connected").set(if status.connected { 1.0 } else { 0.0 });
    metrics::gauge!("fqdnd_cluster_temporary_identities")
        .set(status.temporary_identities.len() as f64);
    metrics::gauge!("fqdnd_cluster_remote_endpoints").set(status.remote_endpoints as f64);
    metrics::gauge!("fqdnd_cluster_identities").set(status.identities as f64);
    for (kind, n) in &status.rejected {
        metrics::counter!("fqdnd_cluster_records_rejected_total", "kind" => kind.clone())
            .absolute(*n);
    }
    if let Some(h) = &status.ha {
        metrics::gauge!("fqdnd_ha_publish_lag_seconds").set(h.publish_lag_ms as f64 / 1000.0);
        metrics::gauge!("fqdnd_ha_import_lag_seconds").set(h.import_lag_ms as f64 / 1000.0);
        metrics::gauge!("fqdnd_ha_pending").set(h.pending as f64);
        metrics::gauge!("fqdnd_ha_published_total").set(h.published as f64);
        metrics::gauge!("fqdnd_ha_imported_total").set(h.imported as f64);
        metrics::gauge!("fqdnd_ha_import_refused_total").set(h.import_refused as f64);
        metrics::gauge!("fqdnd_ha_dropped_total").set(h.dropped as f64);
        metrics::gauge!("fqdnd_ha_revoked_total").set(h.revoked as f64);
        metrics::gauge!("fqdnd_ha_republished_total").set(h.republished as f64);
        metrics::gauge!("fqdnd_ha_startup_import_seconds").set(h.startup_import_ms as f64 / 1000.0);
    }
}
