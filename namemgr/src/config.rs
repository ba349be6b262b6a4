//! The NameManager's own settings, passed in at construction.

/// Settings of the DNS cache, zombies and the per-name / per-endpoint circuit breakers.
///
/// Defaults follow Cilium's flags where one exists (named in each field's doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Lowest TTL (seconds) a cached answer keeps (`tofqdns-min-ttl`, default 0).
    pub min_ttl: u32,
    /// Live IPs kept per name; past it the earliest-expiring are evicted
    /// (`tofqdns-endpoint-max-ip-per-hostname`, default 1000).
    pub max_ips_per_hostname: usize,
    /// Zombies (expired or evicted IPs still in use) kept in all
    /// (`tofqdns-max-deferred-connection-deletes`, default 10000).
    pub max_zombies: usize,
    /// Circuit breaker: IPs one name may hold, live and zombie together, before new IPs for it
    /// are rejected (fqdnd's own; default 2000).
    pub max_ips_per_name: usize,
    /// Circuit breaker: names one endpoint may have live in the cache before answers for new
    /// names are not learned (fqdnd's own; default 50000).
    pub max_names_per_endpoint: usize,
    /// Circuit breaker: (name, IP) mappings the whole cache may hold, live and zombie
    /// together, before new ones are rejected — the bound on the cache's memory whatever the
    /// number of endpoints (fqdnd's own; default 1,000,000).
    pub max_cache_entries: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            min_ttl: 0,
            max_ips_per_hostname: 1000,
            max_zombies: 10_000,
            max_ips_per_name: 2000,
            max_names_per_endpoint: 50_000,
            max_cache_entries: 1_000_000,
        }
    }
}
