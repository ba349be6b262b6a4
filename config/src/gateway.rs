//! `kind: Gateway` and `kind: Node` (`apiVersion: fqdnd.io/v1`): how the daemon runs, as a
//! standalone DNS firewall or as the node agent of local endpoints. At most one of each across
//! all files; paths are relative to the file that names them.
//!
//! ```yaml
//! apiVersion: fqdnd.io/v1
//! kind: Gateway
//! spec:
//!   listen: ["127.0.0.1:53", "[::1]:53"]    # UDP and TCP
//!   upstreams: ["192.0.2.53:53"]             # a health-checked pool; also encrypted:
//!                                             # tls://192.0.2.53#dns.example (DoT, port 853),
//!                                             # https://192.0.2.53/dns-query#dns.example (DoH)
//!   upstreamCA: /etc/fqdnd/upstream-ca.pem    # trust for tls:// and https:// upstreams
//!                                             # (default: /etc/ssl/certs/ca-certificates.crt)
//!   staticZones:                              # zones served from memory (tests, air-gapped)
//!   - origin: example.test
//!     file: zones/example.test.zone           # or `records: |` with the zone text inline
//!   lists:
//!     deny: [lists/ads.txt]                   # files: names, *.wildcards, hosts lines, ||name^
//!     allow: [lists/exceptions.txt]
//!     denyNames: ["tracker.example"]          # the same syntax, inline
//!   adminSocket: /run/fqdnd/admin.sock        # HTTP API, mode 0600
//!   metrics: 127.0.0.1:9967                   # Prometheus /metrics
//!   queryLog: /var/log/fqdnd/queries.jsonl    # one JSON line per query
//!   tls:                                      # DoT/DoH for clients; off unless given
//!     certificate: tls/gateway.pem            # (see the `encrypted` module for every field)
//!     key: tls/gateway.key
//!     dot: ["0.0.0.0:853"]
//!     doh: ["0.0.0.0:443"]
//!   dashboard: {address: 127.0.0.1:9968}      # read-only web view; off unless given
//!                                             # (`tokenFile` required off loopback)
//!   stateDir: /var/lib/fqdnd                  # journal + snapshots: restarts keep the state
//!   stateCompactAfter: 100000                 # journal records between snapshots
//!   upstreamTimeout: 5s
//!   onUpstreamTimeout: servfail               # or noReply (Cilium)
//!   onHoldTimeout: release                    # or servfail
//!   onTruncated: retryTcp                     # or passThrough
//!   randomizeCase: false                      # 0x20 towards upstreams (answers must echo it)
//!   rateLimit: {qps: 200, burst: 400, action: drop}   # per client address; or refused
//!   enforceInterfaces: [lan0]                 # kernel enforcement of forwarded traffic
//!   cache:                                    # answer cache; off unless given
//!     enabled: true                           # default true once `cache` is given
//!     size: 10000                             # entries
//!     minTTL: 0s                              # record TTLs raised to at least this
//!     maxTTL: 1d                              # and cut to at most this
//!     maxNegativeTTL: 1h                      # NXDOMAIN/NODATA: min(SOA TTL, MINIMUM), at most this
//! ---
//! apiVersion: fqdnd.io/v1
//! kind: Node                                  # every field optional
//! spec:
//!   dnsProxyPort: 10053                       # transparent proxy sockets (eBPF redirect)
//!   pinDir: /sys/fs/bpf/fqdnd/v3              # default: versioned by the maps' layout
//!   conntrack: {tcpSyn: 60s, tcpEstablished: 6h, tcpClosing: 10s, other: 60s}
//!                                             # lifetimes after each packet, by state (also
//!                                             # in a Gateway); a flow alive in conntrack
//!                                             # keeps its destination a zombie
//!   conntrackIdleTimeout: 10m                 # deprecated: the lifetime of every state
//!                                             # `conntrack` does not set
//!   hostProcesses: true                       # attach the cgroup socket programs at start
//!                                             # even without a cgroup Endpoint, so one can be
//!                                             # added at run time
//!   mapSizes: {conntrack: 524288, ipcache: 1000000}   # changed sizes migrate the maps
//!                           # (also policy, endpoints, clients, lbServices, lbBackends,
//!                           # endpointAddresses)
//!   # and lists, adminSocket, metrics, queryLog, dashboard, upstreamTimeout, on*, rateLimit as above
//! ```

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

use crate::dns::{
    AnswerCache, HoldFallback, RateLimitAction, TruncatedAction, UpstreamTimeoutAction,
};

use crate::cnp::ObjectMeta;
use crate::upstream::Upstream;
use crate::yaml::{Diag, Text, at, duration, sanitize, shape};

/// Where the gateway's admin API listens unless told otherwise.
pub const DEFAULT_GATEWAY_ADMIN_SOCKET: &str = "/run/fqdnd/gateway.sock";

/// The trust store of encrypted upstreams unless `upstreamCA` names another: Debian's system
/// bundle (package `ca-certificates`).
pub const DEFAULT_UPSTREAM_CA: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where the node agent's admin API listens unless told otherwise (not the gateway's: both
/// may run on one host).
pub const DEFAULT_NODE_ADMIN_SOCKET: &str = "/run/fqdnd/node.sock";

/// Where node mode keeps the endpoints added at run time when its `Node` document has no
/// `stateDir` (see [`Node::endpoints_file`]).
pub const DEFAULT_NODE_ENDPOINTS_ROOT: &str = "/var/lib/fqdnd/pins";

/// The file that keeps the endpoints added at run time to the programs pinned in `pin_dir`
/// when there is no `stateDir`: `endpoints.yaml` in the pin directory's path below
/// [`DEFAULT_NODE_ENDPOINTS_ROOT`] (`/sys/fs/bpf/fqdnd/v3` →
/// `/var/lib/fqdnd/pins/sys/fs/bpf/fqdnd/v3/endpoints.yaml`): agents with other pin
/// directories never share one, and `fqdnd bpf unload` removes it with the pins.
pub fn default_endpoints_file(pin_dir: &Path) -> PathBuf {
    let mut out = PathBuf::from(DEFAULT_NODE_ENDPOINTS_ROOT);
    let mut depth = 0;
    for part in pin_dir.components() {
        match part {
            Component::Normal(p) => {
                out.push(p);
                depth += 1;
            }
            Component::ParentDir if depth > 0 => {
                out.pop();
                depth -= 1;
            }
            _ => {}
        }
    }
    out.join("endpoints.yaml")
}

/// Where a static zone's records come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZoneSource {
    /// A zone file (path resolved against the configuration file's folder).
    File(PathBuf),
    /// Zone-file text given inline.
    Inline(String),
}

/// A zone served from memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticZone {
    /// The zone's origin, e.g. `example.test.`.
    pub origin: String,
    /// Its records.
    pub source: ZoneSource,
}

/// A zone whose names go to upstreams of their own (`zoneUpstreams`: conditional
/// forwarding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneUpstreams {
    /// The zone, canonical (lowercase, trailing dot), e.g. `corp.example.`.
    pub zone: String,
    /// Its upstreams.
    pub upstreams: Vec<Upstream>,
}

/// Allow and deny lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lists {
    /// Deny-list files.
    pub deny: Vec<PathBuf>,
    /// Allow-list files (exceptions to the deny lists).
    pub allow: Vec<PathBuf>,
    /// Deny entries given inline.
    pub deny_names: Vec<String>,
    /// Allow entries given inline.
    pub allow_names: Vec<String>,
}

/// A per-client rate limit (dnsdist's `MaxQPSIPRule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Queries per second per client address.
    pub qps: u32,
    /// Burst before the rate applies (default: `qps`).
    pub burst: u32,
    /// Client addresses tracked at most.
    pub clients: usize,
    /// What happens over the limit.
    pub action: RateLimitAction,
}
/// Kernel map sizes (entries); `None` keeps the built-in size. A change on restart migrates
/// the pinned maps to the new size, entries included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapSizes {
    /// Each of the IPv4 and IPv6 ipcache LPM tries (default 512000).
    pub ipcache: Option<u32>,
    /// The policy hash (default 65536).
    pub policy: Option<u32>,
    /// The conntrack LRU hash (default 262144).
    pub conntrack: Option<u32>,
    /// The endpoint (interface) hash (default 65536).
    pub endpoints: Option<u32>,
    /// Each of the client-prefix LPM tries (default 65536).
    pub clients: Option<u32>,
    /// The load balancer's service slots (service entries and backend slots together) and
    /// rev-NAT entries (default 65536).
    pub lb_services: Option<u32>,
    /// The load balancer's backends (default 65536; backend ids are 16-bit, so at most that).
    pub lb_backends: Option<u32>,
    /// The endpoints' addresses for source validation (default 131072).
    pub endpoint_addresses: Option<u32>,
}

/// How long a kernel conntrack entry lives after each packet, by the flow's state (Cilium's
/// defaults). A flow alive in conntrack keeps its destination a zombie (the DNS GC keeps an
/// expired name's IP while such a flow lives); a dead entry is removed by the GC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conntrack {
    /// A TCP flow that has seen only SYNs (default 60 s).
    pub tcp_syn: Duration,
    /// An established TCP flow (default 6 h).
    pub tcp_established: Duration,
    /// A TCP flow after FIN in both directions or an RST (default 10 s).
    pub tcp_closing: Duration,
    /// UDP, ICMP echo and every other flow (default 60 s).
    pub other: Duration,
}

impl Default for Conntrack {
    fn default() -> Self {
        Self {
            tcp_syn: Duration::from_secs(60),
            tcp_established: Duration::from_secs(6 * 3600),
            tcp_closing: Duration::from_secs(10),
            other: Duration::from_secs(60),
        }
    }
}

/// The longest conntrack lifetime accepted.
pub const MAX_CONNTRACK_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// What every daemon mode (gateway, node) shares: lists, admin API, metrics, query log and
/// the DNS proxy's behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// Allow and deny lists.
    pub lists: Lists,
    /// The admin API's Unix socket.
    pub admin_socket: PathBuf,
    /// The Prometheus endpoint, if any.
    pub metrics: Option<SocketAddr>,
    /// The JSON-lines query log, if any.
    pub query_log: Option<PathBuf>,
    /// The read-only web dashboard, if any.
    pub dashboard: Option<crate::Dashboard>,
    /// How long an upstream may take.
    pub upstream_timeout: Duration,
    /// What to do when it takes longer.
    pub on_upstream_timeout: UpstreamTimeoutAction,
    /// What to do when the engine is slower than `proxyResponseMaxDelay`.
    pub on_hold_timeout: HoldFallback,
    /// What to do with truncated upstream answers.
    pub on_truncated: TruncatedAction,
    /// The per-client rate limit, if any.
    pub rate_limit: Option<RateLimit>,
    /// Kernel map sizes (node, enforcing gateway).
    pub map_sizes: MapSizes,
    /// Kernel conntrack lifetimes (node, enforcing gateway).
    pub conntrack: Conntrack,
    /// Where learned state is journaled and snapshotted so a restart keeps the DNS cache and
    /// identity numbers; `None`: nothing survives a restart.
    pub state_dir: Option<PathBuf>,
    /// Journal records after which the state is compacted into a snapshot.
    pub state_compact_after: u64,
    /// 0x20: randomise the case of the question name towards upstreams and drop answers that
    /// do not echo it (off by default: a few upstreams do not preserve case).
    pub randomize_case: bool,
}

impl Default for Daemon {
    fn default() -> Self {
        Self {
            lists: Lists::default(),
            admin_socket: PathBuf::from(DEFAULT_GATEWAY_ADMIN_SOCKET),
            metrics: None,
            query_log: None,
            dashboard: None,
            upstream_timeout: Duration::from_secs(5),
            on_upstream_timeout: UpstreamTimeoutAction::default(),
            on_hold_timeout: HoldFallback::default(),
            on_truncated: TruncatedAction::default(),
            rate_limit: None,
            map_sizes: MapSizes::default(),
            conntrack: Conntrack::default(),
            state_dir: None,
            state_compact_after: 100_000,
            randomize_case: false,
        }
    }
}

/// The gateway's settings (`kind: Gateway`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gateway {
    /// Addresses served over UDP and TCP.
    pub listen: Vec<SocketAddr>,
    /// The upstream pool.
    pub upstreams: Vec<Upstream>,
    /// The PEM bundle the certificates of `tls://` and `https://` upstreams are checked
    /// against (`upstreamCA`); `None`: the system's, [`DEFAULT_UPSTREAM_CA`].
    pub upstream_ca: Option<PathBuf>,
    /// Zones whose names go to upstreams of their own (the longest zone holding a name wins;
    /// the rest go to `upstreams`).
    pub zone_upstreams: Vec<ZoneUpstreams>,
    /// Zones served from memory, as the upstream of their own names.
    pub static_zones: Vec<StaticZone>,
    /// LAN interfaces whose forwarded traffic the kernel datapath enforces (client groups
    /// recognised by source address); empty: DNS filtering only.
    pub enforce_interfaces: Vec<String>,
    /// The bpffs directory for pinned maps and links when enforcing (default: versioned,
    /// under `/sys/fs/bpf/fqdnd`).
    pub pin_dir: Option<PathBuf>,
    /// The answer cache (`cache`); `None`: off (the default).
    pub cache: Option<AnswerCache>,
    /// DoT and DoH for clients (`tls`); `None`: off (the default).
    pub tls: Option<crate::EncryptedDns>,
    /// What every mode shares.
    pub daemon: Daemon,
}

/// The node agent's settings (`kind: Node`): fqdnd as the sidecar-less DNS proxy and
/// enforcer of the endpoints on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The port of the transparent DNS proxy sockets (UDP and TCP, IPv4 and IPv6) that the
    /// eBPF redirect assigns endpoints' DNS packets to.
    pub dns_proxy_port: u16,
    /// The bpffs directory for pinned maps and links (default: versioned, under
    /// `/sys/fs/bpf/fqdnd`).
    pub pin_dir: Option<PathBuf>,
    /// Deprecated `conntrackIdleTimeout`, from before conntrack had TCP state: when given,
    /// the lifetime of every state `conntrack` does not set (already applied to
    /// `daemon.conntrack`; kept so the daemon can warn).
    pub conntrack_idle_timeout: Option<Duration>,
    /// `hostProcesses`: attach the cgroup socket programs at start-up even when no Endpoint
    /// of host processes (`cgroup`, `unit`) is declared, so that one can be added at run
    /// time. (Attaching a cgroup skb program needs CAP_NET_ADMIN, which the node drops after
    /// start-up; without this, they are attached at start-up only for the cgroup Endpoints
    /// of the files and of the state directory.) Every packet of the host then pays one map
    /// lookup while there is no such endpoint.
    pub host_processes: bool,
    /// What every mode shares.
    pub daemon: Daemon,
}

/// The node's DNS proxy port unless told otherwise.
pub const DEFAULT_DNS_PROXY_PORT: u16 = 10053;

impl Node {
    /// Where the endpoints added at run time (admin API, CNI plugin) are kept for restarts,
    /// the pin directory being `pin_dir`: `<stateDir>/endpoints.yaml`, else
    /// [`default_endpoints_file`]. Always somewhere: a restarted agent that forgot them would
    /// detach its programs from workloads it enforced.
    pub fn endpoints_file(&self, pin_dir: &Path) -> PathBuf {
        match &self.daemon.state_dir {
            Some(dir) => dir.join("endpoints.yaml"),
            None => default_endpoints_file(pin_dir),
        }
    }
}

impl Default for Node {
    fn default() -> Self {
        Self {
            dns_proxy_port: DEFAULT_DNS_PROXY_PORT,
            pin_dir: None,
            conntrack_idle_timeout: None,
            host_processes: false,
            daemon: Daemon {
                admin_socket: PathBuf::from(DEFAULT_NODE_ADMIN_SOCKET),
                ..Daemon::default()
            },
        }
    }
}

/// A whole `Gateway` or `Node` document.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct DaemonDoc {
    #[serde(rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    #[serde(rename = "kind")]
    _kind: Option<IgnoredAny>,
    #[serde(rename = "metadata")]
    _metadata: Option<ObjectMeta>,
    spec: Option<Spanned<DaemonSpec>>,
}

/// Both kinds' fields; each kind refuses the other's.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct DaemonSpec {
    // Gateway only.
    listen: Option<Vec<Text>>,
    upstreams: Option<Vec<Text>>,
    #[serde(rename = "upstreamCA")]
    upstream_ca: Option<Text>,
    zone_upstreams: Option<Vec<Spanned<ZoneUpstreamsSpec>>>,
    static_zones: Option<Vec<Spanned<ZoneSpec>>>,
    enforce_interfaces: Option<Vec<Text>>,
    cache: Option<Spanned<CacheSpec>>,
    tls: Option<Spanned<crate::encrypted::TlsSpec>>,
    // Node only.
    dns_proxy_port: Option<Spanned<u16>>,
    conntrack_idle_timeout: Option<Text>,
    host_processes: Option<bool>,
    // Both.
    pin_dir: Option<Text>,
    lists: Option<ListsSpec>,
    admin_socket: Option<Text>,
    metrics: Option<Text>,
    query_log: Option<Text>,
    dashboard: Option<Spanned<crate::dashboard::DashboardSpec>>,
    upstream_timeout: Option<Text>,
    on_upstream_timeout: Option<Text>,
    on_hold_timeout: Option<Text>,
    on_truncated: Option<Text>,
    rate_limit: Option<Spanned<RateLimitSpec>>,
    map_sizes: Option<MapSizesSpec>,
    conntrack: Option<Spanned<ConntrackSpec>>,
    state_dir: Option<Text>,
    state_compact_after: Option<Spanned<u64>>,
    randomize_case: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct MapSizesSpec {
    ipcache: Option<Spanned<u32>>,
    policy: Option<Spanned<u32>>,
    conntrack: Option<Spanned<u32>>,
    endpoints: Option<Spanned<u32>>,
    clients: Option<Spanned<u32>>,
    lb_services: Option<Spanned<u32>>,
    lb_backends: Option<Spanned<u32>>,
    endpoint_addresses: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct ConntrackSpec {
    tcp_syn: Option<Text>,
    tcp_established: Option<Text>,
    tcp_closing: Option<Text>,
    other: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct RateLimitSpec {
    qps: u32,
    burst: Option<u32>,
    clients: Option<u32>,
    action: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
struct CacheSpec {
    enabled: Option<bool>,
    size: Option<Spanned<u64>>,
    #[serde(rename = "minTTL")]
    min_ttl: Option<Text>,
    #[serde(rename = "maxTTL")]
    max_ttl: Option<Text>,
    #[serde(rename = "maxNegativeTTL")]
    max_negative_ttl: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct ZoneSpec {
    origin: Text,
    file: Option<Text>,
    records: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct ZoneUpstreamsSpec {
    zone: Text,
    upstreams: Vec<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct ListsSpec {
    deny: Option<Vec<Text>>,
    allow: Option<Vec<Text>>,
    deny_names: Option<Vec<String>>,
    allow_names: Option<Vec<String>>,
}

shape!(
    DaemonDoc,
    DaemonSpec,
    MapSizesSpec,
    ConntrackSpec,
    RateLimitSpec,
    CacheSpec,
    ZoneSpec,
    ZoneUpstreamsSpec,
    ListsSpec,
);

/// The folder paths in the document are relative to.
fn base_dir(diag: &Diag<'_>) -> PathBuf {
    diag.file()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Converts the `Gateway` document; `None` if anything in it is wrong.
pub(crate) fn gateway(doc: &Spanned<DaemonDoc>, diag: &mut Diag<'_>) -> Option<Gateway> {
    let doc_at = at(doc);
    let before = diag.count();
    let mut g = Gateway::default();
    let base = base_dir(diag);
    let relative = |text: &Text| base.join(&text.value);
    let Some(spec) = &doc.value.spec else {
        diag.missing(
            doc_at,
            &["spec"],
            "a `Gateway` needs a `spec` with `listen` and `upstreams` or `staticZones`",
        );
        return None;
    };
    let spec_at = at(spec);
    let spec = &spec.value;
    if spec.dns_proxy_port.is_some()
        || spec.conntrack_idle_timeout.is_some()
        || spec.host_processes.is_some()
    {
        diag.invalid(
            spec_at,
            "`dnsProxyPort`, `conntrackIdleTimeout` and `hostProcesses` belong to a `kind: Node` \
             document, not a Gateway",
        );
    }
    for text in spec.listen.iter().flatten() {
        if let Some(addr) = socket_addr("listen", text, diag) {
            g.listen.push(addr);
        }
    }
    for text in spec.upstreams.iter().flatten() {
        if let Some(upstream) = upstream("upstreams", text, diag) {
            g.upstreams.push(upstream);
        }
    }
    g.upstream_ca = spec.upstream_ca.as_ref().map(relative);
    for z in spec.zone_upstreams.iter().flatten() {
        let Some(zone) = zone_name(&z.value.zone, diag) else {
            continue;
        };
        if g.zone_upstreams.iter().any(|o| o.zone == zone) {
            diag.invalid(at(&z.value.zone), format!("zone {zone} is listed twice"));
            continue;
        }
        let upstreams: Vec<Upstream> = z
            .value
            .upstreams
            .iter()
            .filter_map(|text| upstream("zoneUpstreams[].upstreams", text, diag))
            .collect();
        if z.value.upstreams.is_empty() {
            diag.invalid(at(z), format!("zone {zone} needs at least one upstream"));
        }
        g.zone_upstreams.push(ZoneUpstreams { zone, upstreams });
    }
    for zone in spec.static_zones.iter().flatten() {
        let z = &zone.value;
        let origin = z
            .origin
            .value
            .trim()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if origin.is_empty() {
            diag.invalid(
                at(&z.origin),
                "`origin` must name a zone, e.g. `example.test`",
            );
        }
        let source = match (&z.file, &z.records) {
            (Some(file), None) => Some(ZoneSource::File(relative(file))),
            (None, Some(text)) => Some(ZoneSource::Inline(text.clone())),
            _ => {
                diag.invalid(
                    at(zone),
                    "a static zone needs exactly one of `file` and `records`",
                );
                None
            }
        };
        if let Some(source) = source {
            g.static_zones.push(StaticZone {
                origin: format!("{origin}."),
                source,
            });
        }
    }
    for text in spec.enforce_interfaces.iter().flatten() {
        if let Some(name) = interface("enforceInterfaces", text, diag) {
            g.enforce_interfaces.push(name);
        }
    }
    g.pin_dir = spec.pin_dir.as_ref().map(relative);
    g.cache = spec.cache.as_ref().and_then(|c| cache(c, diag));
    g.tls = spec
        .tls
        .as_ref()
        .and_then(|t| crate::encrypted::encrypted(t, &base, diag));
    g.daemon = daemon(spec, &base, Daemon::default(), diag);
    if diag.count() == before {
        if g.listen.is_empty() {
            diag.invalid(doc_at, "a `Gateway` needs at least one `listen` address");
        }
        if g.upstreams.is_empty() && g.static_zones.is_empty() && g.zone_upstreams.is_empty() {
            diag.invalid(
                doc_at,
                "a `Gateway` needs `upstreams`, `zoneUpstreams` or `staticZones`",
            );
        }
        for z in &g.static_zones {
            if g.zone_upstreams.iter().any(|u| u.zone == z.origin) {
                diag.invalid(
                    doc_at,
                    format!(
                        "zone {} is both a static zone and in `zoneUpstreams`: say where its names go once",
                        z.origin
                    ),
                );
            }
        }
    }
    (diag.count() == before).then_some(g)
}

/// The `cache` block: `None` when it is off (`enabled: false`) or wrong (reported).
fn cache(spec: &Spanned<CacheSpec>, diag: &mut Diag<'_>) -> Option<AnswerCache> {
    let c = &spec.value;
    let mut config = AnswerCache::default();
    let before = diag.count();
    if let Some(size) = &c.size {
        match usize::try_from(size.value) {
            Ok(n) if (1..=100_000_000).contains(&n) => config.max_entries = n,
            _ => diag.invalid(at(size), "`cache.size` must be 1 to 100000000 entries"),
        }
    }
    let mut seconds = |field: &str, text: &Option<Text>, into: &mut u32| {
        if let Some(text) = text
            && let Some(d) = duration(field, text, diag)
        {
            match u32::try_from(d.as_secs()) {
                Ok(s) if d.subsec_nanos() == 0 => *into = s,
                _ => diag.invalid(at(text), format!("`{field}` must be whole seconds")),
            }
        }
    };
    seconds("cache.minTTL", &c.min_ttl, &mut config.min_ttl);
    seconds("cache.maxTTL", &c.max_ttl, &mut config.max_ttl);
    seconds(
        "cache.maxNegativeTTL",
        &c.max_negative_ttl,
        &mut config.max_negative_ttl,
    );
    if diag.count() == before && config.min_ttl > config.max_ttl {
        diag.invalid(at(spec), "`cache.minTTL` must not exceed `cache.maxTTL`");
    }
    (diag.count() == before && c.enabled != Some(false)).then_some(config)
}

/// Converts the `Node` document; `None` if anything in it is wrong.
pub(crate) fn node(doc: &Spanned<DaemonDoc>, diag: &mut Diag<'_>) -> Option<Node> {
    let before = diag.count();
    let mut n = Node::default();
    let base = base_dir(diag);
    let Some(spec) = &doc.value.spec else {
        // Every field has a default.
        return Some(n);
    };
    let spec_at = at(spec);
    let spec = &spec.value;
    if spec.listen.is_some()
        || spec.upstreams.is_some()
        || spec.upstream_ca.is_some()
        || spec.zone_upstreams.is_some()
        || spec.static_zones.is_some()
        || spec.enforce_interfaces.is_some()
        || spec.cache.is_some()
        || spec.tls.is_some()
    {
        diag.invalid(
            spec_at,
            "a `Node` forwards each query to the resolver the endpoint asked (its original \
             destination, no answer cache, as Cilium's proxy) and enforces every declared \
             endpoint's interface: `listen`, `upstreams`, `upstreamCA`, `zoneUpstreams`, `staticZones`, \
             `enforceInterfaces`, `cache` and `tls` belong to a `kind: Gateway`",
        );
    }
    if let Some(port) = &spec.dns_proxy_port {
        if port.value == 0 {
            diag.invalid(at(port), "`dnsProxyPort` must be a port (1-65535)");
        } else {
            n.dns_proxy_port = port.value;
        }
    }
    let mut defaults = Node::default().daemon;
    if let Some(text) = &spec.conntrack_idle_timeout
        && let Some(d) = duration("conntrackIdleTimeout", text, diag)
    {
        if d < Duration::from_secs(1) || d > MAX_CONNTRACK_LIFETIME {
            diag.invalid(
                at(text),
                "`conntrackIdleTimeout` must be between 1s and 30 days",
            );
        } else {
            // the old single idle timeout: every lifetime `conntrack` does not set
            n.conntrack_idle_timeout = Some(d);
            defaults.conntrack = Conntrack {
                tcp_syn: d,
                tcp_established: d,
                tcp_closing: d,
                other: d,
            };
        }
    }
    n.pin_dir = spec.pin_dir.as_ref().map(|t| base.join(&t.value));
    n.host_processes = spec.host_processes.unwrap_or(false);
    n.daemon = daemon(spec, &base, defaults, diag);
    (diag.count() == before).then_some(n)
}

/// A network interface name as Linux accepts it.
pub(crate) fn interface(field: &str, text: &Text, diag: &mut Diag<'_>) -> Option<String> {
    let name = text.value.trim();
    let ok = !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if ok {
        Some(name.to_owned())
    } else {
        diag.invalid(
            at(text),
            format!(
                "`{field}` {:?} is not an interface name (1-15 characters, no `/`, `:` or spaces)",
                sanitize(name)
            ),
        );
        None
    }
}

/// The fields both kinds share.
/// The daemon options of a document, over the mode's defaults `d`.
fn daemon(spec: &DaemonSpec, base: &Path, mut d: Daemon, diag: &mut Diag<'_>) -> Daemon {
    let relative = |text: &Text| base.join(&text.value);
    if let Some(lists) = &spec.lists {
        d.lists.deny = lists.deny.iter().flatten().map(relative).collect();
        d.lists.allow = lists.allow.iter().flatten().map(relative).collect();
        d.lists.deny_names = lists.deny_names.clone().unwrap_or_default();
        d.lists.allow_names = lists.allow_names.clone().unwrap_or_default();
    }
    if let Some(text) = &spec.admin_socket {
        d.admin_socket = relative(text);
    }
    if let Some(text) = &spec.metrics {
        d.metrics = socket_addr("metrics", text, diag);
    }
    if let Some(text) = &spec.query_log {
        d.query_log = Some(relative(text));
    }
    if let Some(dashboard) = &spec.dashboard {
        d.dashboard = crate::dashboard::dashboard(dashboard, base, diag);
    }
    if let Some(text) = &spec.state_dir {
        d.state_dir = Some(relative(text));
    }
    if let Some(on) = spec.randomize_case {
        d.randomize_case = on;
    }
    if let Some(n) = &spec.state_compact_after {
        if n.value == 0 {
            diag.invalid(at(n), "`stateCompactAfter` must be at least 1 record");
        } else {
            d.state_compact_after = n.value;
        }
    }
    if let Some(text) = &spec.upstream_timeout
        && let Some(t) = duration("upstreamTimeout", text, diag)
    {
        if t.is_zero() || t > Duration::from_secs(60) {
            diag.invalid(at(text), "`upstreamTimeout` must be between 1ms and 60s");
        } else {
            d.upstream_timeout = t;
        }
    }
    if let Some(text) = &spec.on_upstream_timeout {
        match text.value.as_str() {
            "servfail" => d.on_upstream_timeout = UpstreamTimeoutAction::ServFail,
            "noReply" => d.on_upstream_timeout = UpstreamTimeoutAction::NoReply,
            other => choice(
                "onUpstreamTimeout",
                other,
                "`servfail` or `noReply`",
                text,
                diag,
            ),
        }
    }
    if let Some(text) = &spec.on_hold_timeout {
        match text.value.as_str() {
            "release" => d.on_hold_timeout = HoldFallback::Release,
            "servfail" => d.on_hold_timeout = HoldFallback::ServFail,
            other => choice(
                "onHoldTimeout",
                other,
                "`release` or `servfail`",
                text,
                diag,
            ),
        }
    }
    if let Some(text) = &spec.on_truncated {
        match text.value.as_str() {
            "retryTcp" => d.on_truncated = TruncatedAction::RetryTcp,
            "passThrough" => d.on_truncated = TruncatedAction::PassThrough,
            other => choice(
                "onTruncated",
                other,
                "`retryTcp` or `passThrough`",
                text,
                diag,
            ),
        }
    }
    if let Some(spec) = &spec.rate_limit {
        let r = &spec.value;
        let action = match r.action.as_ref().map(|t| t.value.as_str()) {
            None | Some("drop") => Some(RateLimitAction::Drop),
            Some("refused") => Some(RateLimitAction::Refused),
            Some(other) => {
                if let Some(text) = &r.action {
                    choice("rateLimit.action", other, "`drop` or `refused`", text, diag);
                }
                None
            }
        };
        if r.qps == 0 {
            diag.invalid(
                at(spec),
                "`rateLimit.qps` must be at least 1 (leave `rateLimit` out for no limit)",
            );
        } else if let Some(action) = action {
            d.rate_limit = Some(RateLimit {
                qps: r.qps,
                burst: r.burst.unwrap_or(r.qps).max(1),
                clients: r.clients.map_or(65_536, |c| c.max(1) as usize),
                action,
            });
        }
    }
    if let Some(sizes) = &spec.map_sizes {
        let mut size = |field: &str, value: &Option<Spanned<u32>>| {
            let v = value.as_ref()?;
            let max = if field == "lbBackends" {
                65_536
            } else {
                16_777_216
            };
            if (1..=max).contains(&v.value) {
                Some(v.value)
            } else {
                diag.invalid(
                    at(v),
                    format!("`mapSizes.{field}` must be between 1 and {max} entries"),
                );
                None
            }
        };
        d.map_sizes = MapSizes {
            ipcache: size("ipcache", &sizes.ipcache),
            policy: size("policy", &sizes.policy),
            conntrack: size("conntrack", &sizes.conntrack),
            endpoints: size("endpoints", &sizes.endpoints),
            clients: size("clients", &sizes.clients),
            lb_services: size("lbServices", &sizes.lb_services),
            lb_backends: size("lbBackends", &sizes.lb_backends),
            endpoint_addresses: size("endpointAddresses", &sizes.endpoint_addresses),
        };
    }
    if let Some(ct) = &spec.conntrack {
        let mut lifetime = |field: &str, text: &Option<Text>, into: &mut Duration| {
            let Some(text) = text else { return };
            let Some(v) = duration(&format!("conntrack.{field}"), text, diag) else {
                return;
            };
            if v < Duration::from_secs(1) || v > MAX_CONNTRACK_LIFETIME {
                diag.invalid(
                    at(text),
                    format!("`conntrack.{field}` must be between 1s and 30 days"),
                );
            } else {
                *into = v;
            }
        };
        let c = &ct.value;
        lifetime("tcpSyn", &c.tcp_syn, &mut d.conntrack.tcp_syn);
        lifetime(
            "tcpEstablished",
            &c.tcp_established,
            &mut d.conntrack.tcp_established,
        );
        lifetime("tcpClosing", &c.tcp_closing, &mut d.conntrack.tcp_closing);
        lifetime("other", &c.other, &mut d.conntrack.other);
    }
    d
}

/// A zone name, canonical (lowercase, one trailing dot); `.` is the root. Reported if a label
/// is empty or longer than 63 bytes, or the name longer than 253.
fn zone_name(text: &Text, diag: &mut Diag<'_>) -> Option<String> {
    let name = text.value.trim().trim_end_matches('.').to_ascii_lowercase();
    let ok = name.len() <= 253
        && (name.is_empty()
            || name
                .split('.')
                .all(|l| (1..=63).contains(&l.len()) && l.bytes().all(|b| b.is_ascii_graphic())));
    if !ok {
        diag.invalid(
            at(text),
            format!(
                "`{}` is not a zone name, e.g. `corp.example`",
                text.value.trim()
            ),
        );
        return None;
    }
    Some(format!("{name}."))
}

fn socket_addr(field: &str, text: &Text, diag: &mut Diag<'_>) -> Option<SocketAddr> {
    match text.value.trim().parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            diag.invalid(
                at(text),
                format!(
                    "`{field}` {:?} is not an address with a port: write `192.0.2.1:53` or `[2001:db8::1]:53`",
                    sanitize(&text.value)
                ),
            );
            None
        }
    }
}

/// One upstream entry (see [`crate::upstream`]).
fn upstream(field: &str, text: &Text, diag: &mut Diag<'_>) -> Option<Upstream> {
    match crate::upstream::parse(&text.value) {
        Ok(upstream) => Some(upstream),
        Err(reason) => {
            diag.invalid(at(text), format!("`{field}` {}", sanitize(&reason)));
            None
        }
    }
}

fn choice(field: &str, got: &str, expected: &str, text: &Text, diag: &mut Diag<'_>) {
    diag.invalid(
        at(text),
        format!("`{field}` {:?}: expected {expected}", sanitize(got)),
    );
}
