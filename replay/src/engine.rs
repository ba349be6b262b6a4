//! The daemon's own engine (`fqdnd_engine::Engine`: NameManager + IpCache, here over an
//! in-memory datapath) driven by a capture's clock, with what a replay counts around it.
//!
//! Every answer is learned and committed at once, as the daemon's observer does; a GC pass
//! runs every `gcInterval` of capture time with no connection in use (a capture says nothing
//! about conntrack). Which endpoint an answer is learned for is the daemon's rule too: the
//! longest declared prefix containing the client (`fqdnd_engine::dns::Clients`), or the
//! endpoint the kernel named for the client's socket when a recording says so.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use fqdnd_config::Settings;
use fqdnd_engine::Engine;
pub use fqdnd_engine::IdentityMode;
use fqdnd_engine::dns::Clients as ClientPrefixes;
use fqdnd_ipcache::policy::{Direction, LabelSelector, Protocol, Rule};
use fqdnd_ipcache::{Endpoint, EndpointId, Identity, IpCache, MemoryDatapath, PolicyKey};
use fqdnd_namemgr::NameManager;
use serde::Serialize;

use crate::Error;
use crate::histogram::Histogram;
use crate::timeseries::Row;
use crate::wall::WallTime;

/// The endpoint of the synthetic "every client" setup.
pub const ALL_CLIENTS: EndpointId = EndpointId(1);

/// Who the clients are.
#[derive(Debug, Clone)]
pub enum Clients {
    /// Every client is one synthetic endpoint, and every rule applies to it (its policy is the
    /// union of all rules).
    All,
    /// Declared endpoints and client groups; a client in none of them is not learned from.
    Declared(Vec<Endpoint>),
}

#[derive(Debug)]
enum ClientMap {
    All,
    Declared {
        prefixes: Box<ClientPrefixes>,
        ids: HashSet<EndpointId>,
    },
}

impl ClientMap {
    fn lookup(&self, client: IpAddr, by_socket: Option<EndpointId>) -> Option<EndpointId> {
        match self {
            Self::All => Some(ALL_CLIENTS),
            Self::Declared { ids, .. } if by_socket.is_some() => {
                by_socket.filter(|id| ids.contains(id))
            }
            Self::Declared { prefixes, .. } => prefixes.lookup(client),
        }
    }
}

/// What one engine run counted. Every field is documented in `docs/replay.md`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunReport {
    /// `selector` or `per-ip`.
    pub identity_mode: String,
    /// Answers given to the NameManager (their client is in an endpoint).
    pub responses_learned: u64,
    /// Answers whose client is in no endpoint or client group (not learned).
    pub responses_without_endpoint: u64,
    /// Answers the NameManager refused for their name (not a name fqdnd stores).
    pub invalid_names: u64,
    /// Engine errors other than breakers (identity space exhausted, datapath refused).
    pub engine_errors: u64,
    /// New (name, IP) mappings learned.
    pub new_mappings: u64,
    /// IPs that carry at least one `fqdn:` label at the end.
    pub selected_ips: usize,
    /// Identities created since the start (all scopes, pre-allocated ones included).
    pub identities_allocated_total: u64,
    /// Most identities alive at once.
    pub identities_peak: usize,
    /// Identities alive at the end.
    pub identities_live_end: usize,
    /// Of them, identities whose labels include an `fqdn:` label.
    pub fqdn_identities_live_end: usize,
    /// Distinct non-empty sets of `fqdn:` labels held by live IPs at the end.
    pub label_sets_live_end: usize,
    /// Prefix → identity entries written to the datapath.
    pub ipcache_upserts: u64,
    /// Prefix entries deleted from the datapath.
    pub ipcache_deletes: u64,
    /// Policy-map entries added.
    pub policy_upserts: u64,
    /// Policy-map entries removed.
    pub policy_deletes: u64,
    /// Times a selector gained or lost an identity.
    pub selector_updates: u64,
    /// Circuit-breaker trips seen by the NameManager (all three breakers).
    pub breaker_trips: u64,
    /// Of them, upserts refused by the FQDN identity breaker (counted by the IpCache).
    pub breaker_trips_fqdn_identities: u64,
    /// GC passes run.
    pub gc_runs: u64,
    /// (name, IP) mappings released by GC.
    pub gc_evictions: u64,
    /// Names in the DNS cache at the end.
    pub cache_names_end: usize,
    /// Distinct IPs in the DNS cache at the end.
    pub cache_ips_end: usize,
    /// (name, IP) mappings in the DNS cache at the end.
    pub cache_mappings_end: usize,
    /// Most distinct IPs in the DNS cache at once.
    pub cache_ips_peak: usize,
    /// Prefixes with IpCache metadata at the end.
    pub ipcache_prefixes_end: usize,
    /// Per-answer engine time (observe + commit), wall clock: median.
    pub processing_ns_p50: u64,
    /// 90th percentile.
    pub processing_ns_p90: u64,
    /// 99th percentile.
    pub processing_ns_p99: u64,
    /// Largest.
    pub processing_ns_max: u64,
    /// Mean.
    pub processing_ns_mean: f64,
    /// Total engine time (answers and GC), seconds.
    pub engine_seconds: f64,
}

/// The state at the last time-series sample, for per-second deltas.
#[derive(Debug, Default, Clone)]
struct Snapshot {
    responses: u64,
    upserts: u64,
    deletes: u64,
    created: u64,
    live: usize,
    gc_released: u64,
    trips: u64,
}

/// One engine fed by a capture.
#[derive(Debug)]
pub struct EngineRun {
    mode: IdentityMode,
    engine: Engine<MemoryDatapath>,
    clients: ClientMap,
    gc_interval: Duration,
    next_gc: Duration,
    hist: Histogram,
    gc_nanos: u128,
    report: RunReport,
    snap: Snapshot,
}

impl EngineRun {
    /// Builds the engine: endpoints, then policy, then selectors, then one commit.
    ///
    /// # Errors
    /// The policy or endpoints are refused by the IpCache or NameManager.
    pub fn new(
        settings: &Settings,
        rules: &[Rule],
        clients: &Clients,
        mode: IdentityMode,
    ) -> Result<Self, Error> {
        let (endpoints, rules, clients) = match clients {
            Clients::All => {
                let all = Endpoint {
                    id: ALL_CLIENTS,
                    name: "all-clients".into(),
                    addresses: Vec::new(),
                    labels: Vec::new(),
                };
                let rules = rules
                    .iter()
                    .map(|r| Rule {
                        endpoint_selector: LabelSelector::default(),
                        ..r.clone()
                    })
                    .collect();
                (vec![all], rules, ClientMap::All)
            }
            Clients::Declared(endpoints) => (
                endpoints.clone(),
                rules.to_vec(),
                ClientMap::Declared {
                    prefixes: Box::new(ClientPrefixes::new(endpoints)),
                    ids: endpoints.iter().map(|e| e.id).collect(),
                },
            ),
        };
        let mut engine = Engine::new(settings, mode, MemoryDatapath::default());
        engine
            .apply(endpoints, rules, Duration::ZERO)
            .map_err(|source| Error::Engine { source })?;
        let gc_interval = settings.gc_interval.max(Duration::from_secs(1));
        Ok(Self {
            mode,
            engine,
            clients,
            gc_interval,
            next_gc: gc_interval,
            hist: Histogram::default(),
            gc_nanos: 0,
            report: RunReport {
                identity_mode: mode.name().to_owned(),
                ..RunReport::default()
            },
            snap: Snapshot::default(),
        })
    }

    /// The identity mode.
    pub fn mode(&self) -> IdentityMode {
        self.mode
    }

    /// The NameManager (read only).
    pub fn names(&self) -> &NameManager {
        &self.engine.names
    }

    /// The IpCache (read only).
    pub fn ipcache(&self) -> &IpCache<MemoryDatapath> {
        &self.engine.ipcache
    }

    /// Runs the GC passes due by `now` (capture time since the start). When several are due
    /// at once (a quiet stretch of the capture), only the last runs: with no connection in use
    /// a pass at time T leaves the state every earlier pass would have left plus its own.
    pub fn advance(&mut self, now: Duration) {
        if now < self.next_gc {
            return;
        }
        let behind = (now - self.next_gc).as_nanos() / self.gc_interval.as_nanos().max(1);
        let steps = u32::try_from(behind).unwrap_or(u32::MAX);
        let tick = self
            .next_gc
            .checked_add(self.gc_interval.saturating_mul(steps))
            .unwrap_or(now);
        self.gc(tick);
        self.next_gc = tick.saturating_add(self.gc_interval);
    }

    /// One GC pass at `now` and its commit.
    pub fn gc(&mut self, now: Duration) {
        let started = WallTime::now();
        let nothing_in_use = |_: IpAddr| false;
        match self.engine.gc(now, &nothing_in_use) {
            Ok(stats) => self.report.gc_evictions += stats.released as u64,
            Err(e) => self.engine_error(&e),
        }
        self.gc_nanos += started.elapsed().as_nanos();
    }

    /// The egress allow entries that let `endpoint` reach `addr` now (identity any or
    /// `addr`'s), with the identity left out: the ports and protocols it may use. An allow
    /// whose first port a deny wins over is left out (a deny of part of an allow's ports
    /// leaves the allow whole: the report shows allows, not the holes in them).
    pub fn access(&self, endpoint: EndpointId, addr: IpAddr) -> Vec<PolicyKey> {
        let datapath = self.engine.ipcache.datapath();
        let identity = datapath.identity_of(addr);
        let keys = datapath.policy(endpoint).into_iter().flatten();
        keys.clone()
            .filter(|k| k.direction == Direction::Egress && !k.deny)
            .filter(|k| k.identity == Identity::ANY || k.identity == identity)
            .filter(|k| {
                let protocol = if k.protocol == Protocol::Any {
                    Protocol::Tcp
                } else {
                    k.protocol
                };
                fqdnd_ipcache::verdict(keys.clone(), Direction::Egress, identity, protocol, k.port)
                    .is_some_and(|v| !v.deny)
            })
            .map(|k| PolicyKey {
                identity: Identity::ANY,
                ..*k
            })
            .collect()
    }

    /// The egress allow entries of `endpoint`'s policy that reach every address (identity
    /// any).
    pub fn access_anywhere(&self, endpoint: EndpointId) -> Vec<PolicyKey> {
        self.engine
            .ipcache
            .datapath()
            .policy(endpoint)
            .into_iter()
            .flatten()
            .filter(|k| k.identity == Identity::ANY && k.direction == Direction::Egress && !k.deny)
            .copied()
            .collect()
    }

    /// Learns one answer for `client` at `now`: `addrs` for `name` with `ttl`. The client's
    /// endpoint is the one its address belongs to, or `by_socket`, the endpoint a recording
    /// says the kernel named for the client's socket (host processes share the host's
    /// addresses), when given; with declared endpoints, a response to a client in none of
    /// them is counted and not learned.
    pub fn observe(
        &mut self,
        client: IpAddr,
        by_socket: Option<EndpointId>,
        name: &str,
        addrs: &[IpAddr],
        ttl: u32,
        now: Duration,
    ) {
        let Some(endpoint) = self.clients.lookup(client, by_socket) else {
            self.report.responses_without_endpoint += 1;
            return;
        };
        self.learn(endpoint, name, addrs, ttl, now);
    }

    /// Learns one answer for `endpoint` (which the caller found) at `now`.
    pub fn learn(
        &mut self,
        endpoint: EndpointId,
        name: &str,
        addrs: &[IpAddr],
        ttl: u32,
        now: Duration,
    ) {
        self.report.responses_learned += 1;
        let started = WallTime::now();
        let result = self.engine.learn(endpoint, name, addrs, ttl, now);
        self.hist
            .record(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        match result {
            Ok(_) => {}
            Err(fqdnd_engine::Error::Names(fqdnd_namemgr::Error::InvalidName { .. })) => {
                self.report.invalid_names += 1;
            }
            Err(fqdnd_engine::Error::Names(fqdnd_namemgr::Error::BreakerTripped { .. })) => {}
            Err(e) => self.engine_error(&e),
        }
        let ips = self.engine.names.ip_count();
        self.report.cache_ips_peak = self.report.cache_ips_peak.max(ips);
    }

    fn engine_error(&mut self, e: &fqdnd_engine::Error) {
        if self.report.engine_errors == 0 {
            tracing::warn!(mode = self.mode.name(), error = %fqdnd_engine::error_chain(e), "engine error (counted; later ones are not logged)");
        }
        self.report.engine_errors += 1;
    }

    /// A time-series row for capture second `t`, with changes since the previous row.
    pub fn sample(&mut self, t: u64) -> Row {
        let stats = self.engine.ipcache.stats();
        let alloc = self.engine.ipcache.allocator();
        let name_stats = self.engine.names.stats();
        let now = Snapshot {
            responses: self.report.responses_learned,
            upserts: stats.ipcache_upserts,
            deletes: stats.ipcache_deletes,
            created: alloc.created_total(),
            live: alloc.len(),
            gc_released: self.report.gc_evictions,
            trips: name_stats.breaker_trips,
        };
        let prev = std::mem::replace(&mut self.snap, now.clone());
        let created = now.created - prev.created;
        // live = previous live + created - released.
        let released = (prev.live as u64 + created).saturating_sub(now.live as u64);
        Row {
            t,
            mode: self.mode,
            responses: now.responses - prev.responses,
            identities: now.live,
            identities_from_dns: alloc.from_dns_live(),
            identities_created: created,
            identities_released: released,
            cache_names: self.engine.names.name_count(),
            cache_ips: self.engine.names.ip_count(),
            ipcache_prefixes: self.engine.ipcache.prefix_count(),
            ipcache_upserts: now.upserts - prev.upserts,
            ipcache_deletes: now.deletes - prev.deletes,
            gc_evictions: now.gc_released - prev.gc_released,
            breaker_trips: now.trips - prev.trips,
        }
    }

    /// The final report (after the caller's last GC pass).
    pub fn report(&self) -> RunReport {
        let mut r = self.report.clone();
        let stats = self.engine.ipcache.stats();
        let alloc = self.engine.ipcache.allocator();
        r.identities_allocated_total = alloc.created_total();
        r.identities_peak = alloc.peak_live();
        r.identities_live_end = alloc.len();
        r.fqdn_identities_live_end = alloc
            .iter()
            .filter(|(id, _, _)| self.engine.ipcache.has_fqdn_label(*id))
            .count();
        let mut fqdn_labels: HashMap<Identity, Option<Arc<str>>> = HashMap::new();
        let mut sets: HashSet<Arc<str>> = HashSet::new();
        let mut selected = 0;
        for (_, identity, _) in self.engine.ipcache.prefixes() {
            let Some(identity) = identity else { continue };
            let labels = fqdn_labels
                .entry(identity)
                .or_insert_with(|| fqdn_label_set(&self.engine.ipcache, identity));
            if let Some(labels) = labels {
                selected += 1;
                sets.insert(labels.clone());
            }
        }
        r.selected_ips = selected;
        r.label_sets_live_end = sets.len();
        r.ipcache_upserts = stats.ipcache_upserts;
        r.ipcache_deletes = stats.ipcache_deletes;
        r.policy_upserts = stats.policy_upserts;
        r.policy_deletes = stats.policy_deletes;
        r.selector_updates = stats.selector_updates;
        r.breaker_trips = self.engine.names.stats().breaker_trips;
        r.breaker_trips_fqdn_identities = stats.breaker_trips;
        r.gc_runs = self.engine.names.stats().gc_runs;
        r.new_mappings = self.engine.names.stats().new_mappings;
        r.cache_names_end = self.engine.names.name_count();
        r.cache_ips_end = self.engine.names.ip_count();
        r.cache_mappings_end = self.engine.names.mapping_count();
        r.ipcache_prefixes_end = self.engine.ipcache.prefix_count();
        r.processing_ns_p50 = self.hist.quantile(0.50);
        r.processing_ns_p90 = self.hist.quantile(0.90);
        r.processing_ns_p99 = self.hist.quantile(0.99);
        r.processing_ns_max = self.hist.max();
        r.processing_ns_mean = self.hist.mean();
        r.engine_seconds = (self.hist.sum() + self.gc_nanos) as f64 / 1e9;
        r
    }
}

/// The `fqdn:` labels of an identity as one string (sorted), or `None` if it has none.
fn fqdn_label_set(ipcache: &IpCache<MemoryDatapath>, id: Identity) -> Option<Arc<str>> {
    let rendered = ipcache.labels_of(id)?;
    let mut labels: Vec<&str> = rendered
        .split(',')
        .filter(|l| l.starts_with("fqdn:"))
        .collect();
    if labels.is_empty() {
        return None;
    }
    labels.sort_unstable();
    Some(Arc::from(labels.join(",")))
}
