//! Every series the daemons serve, named, typed and described once. The proxy's own are
//! [`fqdnd_dnsproxy::metrics::SERIES`]; [`served`] is what a gateway or node serves,
//! [`OPERATOR`] what `fqdnd operator --metrics` serves. docs/manual/metrics.md lists exactly
//! these (a test checks it).

use fqdnd_dnsproxy::metrics::{BYTES, COUNT, Kind, SECONDS, Series};
use metrics::Unit;

/// Identities allocated (all scopes).
pub const IDENTITIES: &str = "fqdnd_identities";
/// Identities DNS answers created.
pub const FQDN_IDENTITIES: &str = "fqdnd_fqdn_identities";
/// Names in the DNS cache (the NameManager's learned names).
pub const CACHE_NAMES: &str = "fqdnd_cache_names";
/// (name, IP) mappings in the DNS cache.
pub const CACHE_ENTRIES: &str = "fqdnd_cache_entries";
/// Expired IPs kept while in use.
pub const CACHE_ZOMBIES: &str = "fqdnd_cache_zombies";
/// The bound on the DNS cache's mappings.
pub const CACHE_ENTRIES_MAX: &str = "fqdnd_cache_entries_max";
/// Prefixes in the IpCache.
pub const IPCACHE_PREFIXES: &str = "fqdnd_ipcache_prefixes";
/// Changes a breaker refused (`breaker` label).
pub const BREAKER_TRIPS: &str = "fqdnd_breaker_trips_total";
/// Changes refused for lack of room in a kernel map (`map` label).
pub const MAP_FULL: &str = "fqdnd_datapath_map_full_total";
/// Entries in a kernel map (`map` label).
pub const MAP_ENTRIES: &str = "fqdnd_datapath_map_entries";
/// A kernel map's size (`map` label).
pub const MAP_CAPACITY: &str = "fqdnd_datapath_map_capacity";
/// Packets the datapath dropped (`reason` label).
pub const POLICY_DROPS: &str = "fqdnd_policy_drops_total";
/// Query-log records dropped.
pub const QUERYLOG_DROPPED: &str = "fqdnd_querylog_dropped_total";
/// Journal records made durable.
pub const CHECKPOINT_RECORDS: &str = "fqdnd_checkpoint_records_total";
/// Journal syncs.
pub const CHECKPOINT_FSYNCS: &str = "fqdnd_checkpoint_fsyncs_total";
/// Journal bytes written.
pub const CHECKPOINT_BYTES: &str = "fqdnd_checkpoint_bytes_total";
/// Journal batches that failed.
pub const CHECKPOINT_FAILED_BATCHES: &str = "fqdnd_checkpoint_failed_batches_total";
/// Records and state files that could not be written.
pub const CHECKPOINT_ERRORS: &str = "fqdnd_checkpoint_errors_total";
/// Journal batches slower than a bound (`over` label).
pub const CHECKPOINT_SLOW_BATCHES: &str = "fqdnd_checkpoint_slow_batches_total";
/// Records in the last journal batch.
pub const CHECKPOINT_LAST_BATCH_RECORDS: &str = "fqdnd_checkpoint_last_batch_records";
/// The last `fdatasync`'s duration.
pub const CHECKPOINT_LAST_FSYNC: &str = "fqdnd_checkpoint_last_fsync_seconds";
/// The journal's backlog.
pub const CHECKPOINT_QUEUED_BYTES: &str = "fqdnd_checkpoint_queued_bytes";
/// Names not known durable yet.
pub const CHECKPOINT_NAMES_IN_DOUBT: &str = "fqdnd_checkpoint_names_in_doubt";
/// Cluster mode: 1 while etcd answers.
pub const CLUSTER_CONNECTED: &str = "fqdnd_cluster_connected";
/// Cluster mode: label sets on a temporary identity.
pub const CLUSTER_TEMPORARY_IDENTITIES: &str = "fqdnd_cluster_temporary_identities";
/// Cluster mode: other nodes' endpoints known.
pub const CLUSTER_REMOTE_ENDPOINTS: &str = "fqdnd_cluster_remote_endpoints";
/// Cluster mode: global identities known.
pub const CLUSTER_IDENTITIES: &str = "fqdnd_cluster_identities";
/// Records in etcd refused as read (`kind` label).
pub const CLUSTER_REJECTED: &str = "fqdnd_cluster_records_rejected_total";
/// HA group: the last batch's publish lag.
pub const HA_PUBLISH_LAG: &str = "fqdnd_ha_publish_lag_seconds";
/// HA group: the last import's lag.
pub const HA_IMPORT_LAG: &str = "fqdnd_ha_import_lag_seconds";
/// HA group: answers waiting to be published.
pub const HA_PENDING: &str = "fqdnd_ha_pending";
/// HA group: the import at start.
pub const HA_STARTUP_IMPORT: &str = "fqdnd_ha_startup_import_seconds";
/// HA group: records published.
pub const HA_PUBLISHED: &str = "fqdnd_ha_published_total";
/// HA group: records imported.
pub const HA_IMPORTED: &str = "fqdnd_ha_imported_total";
/// HA group: records refused here.
pub const HA_IMPORT_REFUSED: &str = "fqdnd_ha_import_refused_total";
/// HA group: answers dropped before publishing.
pub const HA_DROPPED: &str = "fqdnd_ha_dropped_total";
/// HA group: revocations applied.
pub const HA_REVOKED: &str = "fqdnd_ha_revoked_total";
/// HA group: answers published again.
pub const HA_REPUBLISHED: &str = "fqdnd_ha_republished_total";
/// Operator: 1 for its state (`state` label).
pub const OPERATOR_STATE: &str = "fqdnd_operator_state";
/// Operator: global identities.
pub const OPERATOR_IDENTITIES: &str = "fqdnd_operator_identities";
/// Operator: identities created.
pub const OPERATOR_CREATED: &str = "fqdnd_operator_identities_created_total";
/// Operator: identities collected.
pub const OPERATOR_COLLECTED: &str = "fqdnd_operator_identities_collected_total";
/// Operator: identity numbers skipped as damaged.
pub const OPERATOR_DAMAGED: &str = "fqdnd_operator_damaged_numbers";

const fn series(name: &'static str, kind: Kind, unit: Option<Unit>, help: &'static str) -> Series {
    Series::new(name, kind, unit, help)
}

use Kind::{Counter, Gauge};

const REJECTED_HELP: &str = "cluster mode: records in etcd refused as read (not well formed, key and value disagreeing, out of range; policy: a shared policy that does not load; learned: an HA group's learned record), once per version of a key, by kind";

/// The gateway's and the node's own series (beside the proxy's).
pub const DAEMON: &[Series] = &[
    series(
        IDENTITIES,
        Gauge,
        COUNT,
        "identities allocated (all scopes)",
    ),
    series(
        FQDN_IDENTITIES,
        Gauge,
        COUNT,
        "identities created by DNS answers (the breaker's count)",
    ),
    series(
        CACHE_NAMES,
        Gauge,
        COUNT,
        "names in the DNS cache (names learned from answers)",
    ),
    series(
        CACHE_ENTRIES,
        Gauge,
        COUNT,
        "(name, IP) mappings in the DNS cache, zombies included",
    ),
    series(
        CACHE_ZOMBIES,
        Gauge,
        COUNT,
        "DNS cache: expired or evicted IPs kept while connections use them",
    ),
    series(
        CACHE_ENTRIES_MAX,
        Gauge,
        COUNT,
        "the bound on (name, IP) mappings in the DNS cache (maxCacheEntries)",
    ),
    series(
        IPCACHE_PREFIXES,
        Gauge,
        COUNT,
        "prefixes with metadata in the IpCache",
    ),
    series(
        BREAKER_TRIPS,
        Counter,
        COUNT,
        "DNS-driven changes a circuit breaker rejected, by breaker",
    ),
    series(
        MAP_FULL,
        Counter,
        COUNT,
        "DNS-driven changes refused because a datapath map had no room, by map",
    ),
    series(
        MAP_ENTRIES,
        Gauge,
        COUNT,
        "entries in a kernel map (ipcache4/ipcache6 as written, conntrack sampled every 10 s)",
    ),
    series(MAP_CAPACITY, Gauge, COUNT, "size of a kernel map"),
    series(
        POLICY_DROPS,
        Counter,
        COUNT,
        "packets the datapath dropped, by reason",
    ),
    series(
        QUERYLOG_DROPPED,
        Counter,
        COUNT,
        "query-log records dropped because the writer fell behind",
    ),
    series(
        CHECKPOINT_RECORDS,
        Counter,
        COUNT,
        "journal records made durable",
    ),
    series(
        CHECKPOINT_FSYNCS,
        Counter,
        COUNT,
        "journal syncs (one per group-commit batch)",
    ),
    series(
        CHECKPOINT_BYTES,
        Counter,
        BYTES,
        "bytes written to the journal",
    ),
    series(
        CHECKPOINT_FAILED_BATCHES,
        Counter,
        COUNT,
        "journal batches that failed",
    ),
    series(
        CHECKPOINT_ERRORS,
        Counter,
        COUNT,
        "records that could not be journaled, and state files that could not be written",
    ),
    series(
        CHECKPOINT_SLOW_BATCHES,
        Counter,
        COUNT,
        "journal batches whose write and fdatasync took longer than a bound, by bound",
    ),
    series(
        CHECKPOINT_LAST_BATCH_RECORDS,
        Gauge,
        COUNT,
        "records in the last journal batch",
    ),
    series(
        CHECKPOINT_LAST_FSYNC,
        Gauge,
        SECONDS,
        "duration of the last journal fdatasync",
    ),
    series(
        CHECKPOINT_QUEUED_BYTES,
        Gauge,
        BYTES,
        "journal bytes queued and not yet written",
    ),
    series(
        CHECKPOINT_NAMES_IN_DOUBT,
        Gauge,
        COUNT,
        "names whose learning is not known durable yet (their refreshes are held)",
    ),
    series(
        CLUSTER_CONNECTED,
        Gauge,
        None,
        "cluster mode: 1 while the node side reaches etcd",
    ),
    series(
        CLUSTER_TEMPORARY_IDENTITIES,
        Gauge,
        COUNT,
        "cluster mode: local label sets waiting for their global identity",
    ),
    series(
        CLUSTER_REMOTE_ENDPOINTS,
        Gauge,
        COUNT,
        "cluster mode: other nodes' endpoints known",
    ),
    series(
        CLUSTER_IDENTITIES,
        Gauge,
        COUNT,
        "cluster mode: global identities known",
    ),
    series(CLUSTER_REJECTED, Counter, COUNT, REJECTED_HELP),
    series(
        HA_PUBLISH_LAG,
        Gauge,
        SECONDS,
        "HA gateway group: the last batch's wait from its oldest answer to its etcd commit",
    ),
    series(
        HA_IMPORT_LAG,
        Gauge,
        SECONDS,
        "HA gateway group: the last import of new records, from the oldest one's answer (peer's wall clock) to its import",
    ),
    series(
        HA_PENDING,
        Gauge,
        COUNT,
        "HA gateway group: learned answers waiting to be written to etcd",
    ),
    series(
        HA_STARTUP_IMPORT,
        Gauge,
        SECONDS,
        "HA gateway group: how long the import of the group's state at start took",
    ),
    series(
        HA_PUBLISHED,
        Counter,
        COUNT,
        "HA gateway group: records written to etcd",
    ),
    series(
        HA_IMPORTED,
        Counter,
        COUNT,
        "HA gateway group: records imported from the group",
    ),
    series(
        HA_IMPORT_REFUSED,
        Counter,
        COUNT,
        "HA gateway group: records refused here (policy, breakers, unknown group)",
    ),
    series(
        HA_DROPPED,
        Counter,
        COUNT,
        "HA gateway group: answers dropped before publishing (queue or pending set full)",
    ),
    series(
        HA_REVOKED,
        Counter,
        COUNT,
        "HA gateway group: revocations applied",
    ),
    series(
        HA_REPUBLISHED,
        Counter,
        COUNT,
        "HA gateway group: answers published again because the group lacked them",
    ),
];

/// `fqdnd operator --metrics`' series.
pub const OPERATOR: &[Series] = &[
    series(
        OPERATOR_STATE,
        Gauge,
        None,
        "operator: 1 for its state (leader, follower, unreachable), 0 for the others",
    ),
    series(
        OPERATOR_IDENTITIES,
        Gauge,
        COUNT,
        "operator: global identities in the leader's view",
    ),
    series(
        OPERATOR_CREATED,
        Counter,
        COUNT,
        "operator: identities this instance created",
    ),
    series(
        OPERATOR_COLLECTED,
        Counter,
        COUNT,
        "operator: unused identities this instance collected",
    ),
    series(
        OPERATOR_DAMAGED,
        Gauge,
        COUNT,
        "operator: identity numbers whose key does not parse (skipped by allocation)",
    ),
    series(CLUSTER_REJECTED, Counter, COUNT, REJECTED_HELP),
];

/// What a gateway or node agent serves: the proxy's series and the daemon's.
pub fn served() -> impl Iterator<Item = &'static Series> {
    fqdnd_dnsproxy::metrics::SERIES.iter().chain(DAEMON)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The metric names of the markdown tables in `text` (first column, backquoted; a
    /// `{label}` suffix is not part of the name).
    fn documented(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter(|l| l.starts_with("| `fqdnd_"))
            .flat_map(|l| l.split('|').nth(1).unwrap_or_default().split("`,"))
            .map(|cell| {
                let name = cell.trim().trim_matches('`');
                name.split('{').next().unwrap_or(name).to_owned()
            })
            .collect()
    }

    fn names<'a>(series: impl Iterator<Item = &'a Series>) -> BTreeSet<String> {
        series.map(|s| s.name.to_owned()).collect()
    }

    const DOCS: &str = include_str!("../../../docs/manual/metrics.md");

    #[test]
    fn the_manual_lists_exactly_the_series_served() {
        let (node, operator) = DOCS
            .split_once("## fqdnd operator")
            .expect("the chapter has an operator section");
        assert_eq!(documented(node), names(served()));
        assert_eq!(documented(operator), names(OPERATOR.iter()));
    }

    #[test]
    fn each_series_is_described_once_and_counters_end_in_total() {
        let mut seen = BTreeSet::new();
        for s in served() {
            assert!(seen.insert(s.name), "{} twice", s.name);
            assert!(!s.help.is_empty());
            assert_eq!(
                s.kind == Counter,
                s.name.ends_with("_total"),
                "{}: a counter's name ends in _total, and only a counter's",
                s.name
            );
        }
    }

    #[test]
    fn the_manual_gives_each_series_its_type() {
        let all: Vec<&Series> = served().chain(OPERATOR).collect();
        for line in DOCS.lines().filter(|l| l.starts_with("| `fqdnd_")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let kind = match cells.get(2).copied() {
                Some("counter") => Counter,
                Some("gauge") => Gauge,
                Some("summary") => Kind::Summary,
                other => panic!("{line}: type {other:?}"),
            };
            for name in documented(line) {
                let s = all.iter().find(|s| s.name == name).unwrap();
                assert_eq!(s.kind, kind, "{name}");
            }
        }
    }
}
