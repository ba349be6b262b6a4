//! The admin API: HTTP/1.1 with JSON on a Unix socket (mode 0600) — the server the daemon runs
//! ([`server`]) and the client the CLI commands use ([`client`]), over the types here and the
//! engine's listings (`fqdnd_engine::view`).
//!
//! | method | path | returns |
//! |---|---|---|
//! | GET | `/v1/status` | [`Status`] |
//! | GET | `/v1/cache` | `CacheRow`s: Cilium's `fqdn cache list` columns |
//! | POST | `/v1/cache/forget` | body = [`ForgetRequest`]; [`ForgetOutcome`]: forgotten at once, out of the engine, the datapath and the journal (and, in an HA group, the group's keys) |
//! | GET | `/v1/identities` | `IdentityRow`s |
//! | GET | `/v1/ipcache` | `IpcacheRow`s |
//! | POST | `/v1/policy/reload` | [`Reload`]: the old policy stays if the new one has errors |
//! | GET | `/v1/policy/explain?endpoint=ID&direction=egress\|ingress&peer=ADDR&protocol=tcp\|udp\|icmp\|icmpv6\|any&port=N` | `Explanation`: which rule allows or denies that flow, by the policy in force |
//! | GET | `/v1/endpoints` | node: `EndpointRow`s |
//! | POST | `/v1/endpoints` | node: body = one `kind: Endpoint` YAML document; adds or replaces it |
//! | DELETE | `/v1/endpoints/{id}` | node: removes an endpoint added through the API |
//! | GET | `/v1/services` | node: `ServiceRow`s (backend ids, rev-NAT index) |
//! | POST | `/v1/services` | node: body = one `kind: Service` YAML document; sets it |
//! | DELETE | `/v1/services/{name}` | node: removes a service added through the API |
//! | GET | `/v1/drops?since=N` | node: `DropPage`, policy drops after sequence number N |
//! | POST | `/v1/cni` | node: body = `CniAttachment` (container id, interface in the container, host-side interface, addresses, labels); that attachment's endpoint (`EndpointRow`), id chosen by the agent |
//! | GET | `/v1/cni/{container}/{ifname}` | node: the `EndpointRow` of the container's attachment through `ifname`, 404 if none |
//! | DELETE | `/v1/cni/{container}/{ifname}` | node: removes that attachment's endpoint; none is not an error |
//! | DELETE | `/v1/cni/{container}` | node: removes every endpoint of the container (a DEL without `CNI_IFNAME`) |
//! | GET | `/v1/record` | `RecordStatus`: the recording running, or the last one |
//! | POST | `/v1/record` | body = `RecordRequest` (`dir`, `maxFileBytes`, `maxFiles`): starts recording |
//! | DELETE | `/v1/record` | stops recording (every message taken is written first); its `RecordStatus` |

pub mod client;
pub mod server;

use serde::{Deserialize, Serialize};

pub use crate::skeleton::{Reload, ReloadHistory};

/// `GET /v1/status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    /// fqdnd's version.
    pub version: String,
    /// `gateway` or `node`.
    #[serde(default)]
    pub mode: String,
    /// Seconds since the daemon started.
    pub uptime_seconds: u64,
    /// The configuration paths it loaded.
    pub config: Vec<String>,
    /// The DNS listeners' addresses.
    pub listen: Vec<String>,
    /// The DoT and DoH listeners: `dot ADDRESS`, `doh ADDRESS`.
    #[serde(default)]
    pub encrypted: Vec<String>,
    /// Queries by outcome, as the proxy counts them.
    pub queries: Vec<(String, u64)>,
    /// The upstream resolvers' health.
    pub upstreams: Vec<UpstreamRow>,
    /// Names in the DNS cache.
    pub cache_names: usize,
    /// (name, address) entries in the DNS cache.
    pub cache_entries: usize,
    /// Addresses expired from the cache but kept while connections use them (zombies).
    pub cache_zombies: usize,
    /// Identities allocated.
    pub identities: usize,
    /// Identities of addresses DNS answered (FQDN selectors).
    pub fqdn_identities: usize,
    /// Prefixes in the IP cache.
    pub ipcache_prefixes: usize,
    /// Changes a circuit breaker refused (names per endpoint, IPs per name).
    pub breaker_trips: u64,
    /// Patterns of the deny list.
    pub deny_list_patterns: usize,
    /// Patterns of the allow list.
    pub allow_list_patterns: usize,
    /// The last reloads and their outcome.
    pub reloads: ReloadHistory,
    /// Cluster mode: the connection, the allocator leader, pending temporary identities.
    #[serde(default)]
    pub cluster: Option<crate::cluster::ClusterStatus>,
    /// The gateway's answer cache; `None` when it is off.
    #[serde(default)]
    pub answer_cache: Option<AnswerCacheRow>,
}

/// `POST /v1/cache/forget`: what to forget.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForgetRequest {
    /// The name (canonicalised: case and the trailing dot do not matter).
    pub name: String,
    /// Its addresses to forget; none: every one.
    #[serde(default)]
    pub addresses: Vec<std::net::IpAddr>,
    /// Only for this client group (gateway) or endpoint (node), by name.
    #[serde(default)]
    pub client: Option<String>,
}

/// What `POST /v1/cache/forget` did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForgetOutcome {
    /// The name, canonical.
    pub name: String,
    /// (name, address) mappings removed from the DNS cache (and their datapath entries).
    pub mappings: usize,
    /// Client groups' (endpoints') records of the name removed.
    pub records: usize,
    /// Whether the mappings were kept because another client group still has the name
    /// (`client` given: the cache is shared).
    pub kept_for_others: bool,
    /// Whether a journal record keeps a restart from bringing it back (with `stateDir`).
    pub journaled: bool,
    /// An HA gateway group's keys changed.
    #[serde(default)]
    pub group: Option<crate::ha::GroupForget>,
}

/// The answer cache's counters (`fqdnd status`).
#[derive(Debug, Serialize, Deserialize)]
pub struct AnswerCacheRow {
    /// Answers cached.
    pub entries: usize,
    /// Answers it can hold.
    pub capacity: usize,
    /// Queries answered from the cache.
    pub hits: u64,
    /// Queries the cache could not answer.
    pub misses: u64,
    /// Answers stored.
    pub inserts: u64,
    /// Answers evicted for room.
    pub evictions: u64,
    /// Answers dropped at their TTL.
    pub expired: u64,
}

/// One upstream's health.
#[derive(Debug, Serialize, Deserialize)]
pub struct UpstreamRow {
    /// Its address, or its `tls://` / `https://` URL.
    pub addr: String,
    /// Whether it answers.
    pub alive: bool,
    /// Consecutive failures.
    pub failures: u32,
    /// Its smoothed round-trip time, microseconds.
    pub rtt_us: Option<u64>,
}
