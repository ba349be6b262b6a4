//! Prometheus metrics: the recorder, and the engine's gauges sampled once a second. The DNS
//! proxy records its own counters and histograms through the same `metrics` facade.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use metrics_exporter_prometheus::PrometheusBuilder;

use crate::gateway::observer::SharedEngine;

/// Serves `/metrics` on `addr`.
pub(crate) fn install(addr: SocketAddr) -> Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .with_context(|| format!("serving Prometheus metrics on {addr}"))?;
    metrics::describe_gauge!("fqdnd_identities", "identities allocated (all scopes)");
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
        "DNS-driven changes a circuit breaker rejected"
    );
    metrics::describe_counter!(
        "fqdnd_querylog_dropped_total",
        "query-log records dropped because the writer fell behind"
    );
    Ok(())
}

/// Samples the engine's state into gauges.
pub(crate) fn record_engine(engine: &SharedEngine) {
    let Ok(engine) = engine.lock() else { return };
    let alloc = engine.ipcache.allocator();
    metrics::gauge!("fqdnd_identities").set(alloc.len() as f64);
    metrics::gauge!("fqdnd_fqdn_identities").set(alloc.from_dns_live() as f64);
    metrics::gauge!("fqdnd_cache_names").set(engine.names.name_count() as f64);
    metrics::gauge!("fqdnd_cache_entries").set(engine.names.mapping_count() as f64);
    metrics::gauge!("fqdnd_cache_zombies").set(engine.names.zombie_count() as f64);
    metrics::gauge!("fqdnd_ipcache_prefixes").set(engine.ipcache.prefix_count() as f64);
    let trips = engine.names.stats().breaker_trips + engine.ipcache.stats().breaker_trips;
    metrics::counter!("fqdnd_breaker_trips_total").absolute(trips);
}
