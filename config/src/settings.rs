//! `kind: Settings` (`apiVersion: fqdnd.io/v1`): the daemon's tunables, every one optional with
//! Cilium's default. At most one such document across all files.
//!
//! ```yaml
//! apiVersion: fqdnd.io/v1
//! kind: Settings
//! spec:
//!   dns:
//!     minTTL: 0
//!     maxIPsPerHostname: 1000
//!     maxDeferredConnectionDeletes: 10000
//!     proxyResponseMaxDelay: 100ms
//!     rejectResponseCode: refused       # or nameError
//!     concurrencyLimit: 0               # 0: unlimited
//!     preallocateIdentities: true
//!   breakers:
//!     maxFQDNIdentities: 2048
//!     maxIPsPerName: 2000
//!     maxNamesPerEndpoint: 50000
//!     maxCacheEntries: 1000000
//!   gcInterval: 60s
//! ```

use std::time::Duration;

use crate::dns::RejectCode;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

use crate::cnp::ObjectMeta;
use crate::yaml::{Diag, Scalar, Text, at, duration, int_in_range, sanitize, shape};

/// Longest `proxyResponseMaxDelay` accepted: holding answers longer than this outlasts the
/// retry timeout of common resolvers (5 s) and Cilium's own forward timeout (10 s).
pub const MAX_PROXY_RESPONSE_DELAY: Duration = Duration::from_secs(10);
/// Shortest `gcInterval` accepted.
pub const MIN_GC_INTERVAL: Duration = Duration::from_secs(1);

/// The daemon's settings, with Cilium's defaults for everything not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `dns.minTTL`: lowest TTL (seconds) a cached answer keeps. Mirrors Cilium's
    /// `tofqdns-min-ttl` (default 0: honour the upstream TTL).
    pub min_ttl: u32,
    /// `dns.maxIPsPerHostname`: live IPs kept per name (earliest-expiring evicted). Mirrors Cilium's
    /// `tofqdns-endpoint-max-ip-per-hostname` (default 1000, at least 1).
    pub max_ips_per_hostname: usize,
    /// `dns.maxDeferredConnectionDeletes`: expired IPs kept while connections still use them
    /// (zombies). Mirrors Cilium's `tofqdns-max-deferred-connection-deletes` (default 10000).
    pub max_deferred_connection_deletes: usize,
    /// `dns.proxyResponseMaxDelay`: longest time a DNS answer is held while the datapath learns
    /// its IPs. Mirrors Cilium's `tofqdns-proxy-response-max-delay` (default 100ms, at most
    /// [`MAX_PROXY_RESPONSE_DELAY`]).
    pub proxy_response_max_delay: Duration,
    /// `dns.rejectResponseCode`: the answer to a query policy denies. Mirrors Cilium's
    /// `tofqdns-dns-reject-response-code` (default `refused`).
    pub reject_response_code: RejectCode,
    /// `dns.concurrencyLimit`: DNS messages in flight at once in the proxy; past it, SERVFAIL.
    /// Mirrors Cilium's `dnsproxy-concurrency-limit` (default 0: unlimited).
    pub concurrency_limit: usize,
    /// `dns.threads`: the DNS path's threads, each with its own UDP listener socket per
    /// listen address (`SO_REUSEPORT`) and share of the upstream sockets, DoT and DoH
    /// connections; read at start. `None`: the proxy's default, half the CPUs (at least one),
    /// leaving the rest to the kernel's packet processing, the upstreams and the workloads.
    pub dns_threads: Option<usize>,
    /// `dns.preallocateIdentities`: allocate `{fqdn:<selector>, world}` identities as soon as a
    /// selector appears. Mirrors Cilium's `tofqdns-preallocate-identities` (default true).
    pub preallocate_identities: bool,
    /// `breakers.maxFQDNIdentities`: identities DNS answers may create, live at once; past it
    /// a new one is refused (fail closed). fqdnd's own circuit breaker (default 2048).
    pub max_fqdn_identities: usize,
    /// `breakers.maxIPsPerName`: IPs one name may hold, live and zombie together, before new
    /// ones are refused. fqdnd's own circuit breaker (default 2000).
    pub max_ips_per_name: usize,
    /// `breakers.maxNamesPerEndpoint`: names one endpoint may have live in the cache before
    /// answers for new names are not learned. fqdnd's own circuit breaker (default 50000).
    pub max_names_per_endpoint: usize,
    /// `breakers.maxCacheEntries`: (name, IP) mappings the whole DNS cache may hold, live and
    /// zombie, before new ones are refused (fail closed): the cache's memory bound whatever
    /// the number of endpoints or names. fqdnd's own circuit breaker (default 1,000,000,
    /// roughly 250–550 MB).
    pub max_cache_entries: usize,
    /// `gcInterval`: how often expired DNS data is collected. Mirrors Cilium's fixed
    /// `DNSGCJobInterval` (default 60s, at least [`MIN_GC_INTERVAL`]).
    pub gc_interval: Duration,
}

impl Default for Settings {
    /// The NameManager's and the IPCache's own defaults (written once, in those crates), and
    /// the proxy-facing ones Cilium uses.
    fn default() -> Self {
        let names = fqdnd_namemgr::Config::default();
        let ips = fqdnd_ipcache::Config::default();
        Self {
            min_ttl: names.min_ttl,
            max_ips_per_hostname: names.max_ips_per_hostname,
            max_deferred_connection_deletes: names.max_zombies,
            proxy_response_max_delay: Duration::from_millis(100),
            reject_response_code: RejectCode::Refused,
            concurrency_limit: 0,
            dns_threads: None,
            preallocate_identities: ips.preallocate_fqdn_identities,
            max_fqdn_identities: ips.max_fqdn_identities,
            max_ips_per_name: names.max_ips_per_name,
            max_names_per_endpoint: names.max_names_per_endpoint,
            max_cache_entries: names.max_cache_entries,
            gc_interval: Duration::from_secs(60),
        }
    }
}

impl Settings {
    /// The NameManager's settings.
    #[must_use]
    pub fn namemgr(&self) -> fqdnd_namemgr::Config {
        fqdnd_namemgr::Config {
            min_ttl: self.min_ttl,
            max_ips_per_hostname: self.max_ips_per_hostname,
            max_zombies: self.max_deferred_connection_deletes,
            max_ips_per_name: self.max_ips_per_name,
            max_names_per_endpoint: self.max_names_per_endpoint,
            max_cache_entries: self.max_cache_entries,
        }
    }

    /// The IPCache's settings.
    #[must_use]
    pub fn ipcache(&self) -> fqdnd_ipcache::Config {
        fqdnd_ipcache::Config {
            max_fqdn_identities: self.max_fqdn_identities,
            preallocate_fqdn_identities: self.preallocate_identities,
            // Per-IP identities are for `fqdnd replay --identity-mode per-ip` only.
            identity_per_prefix: false,
            datapath_prefixes: None,
        }
    }
}

/// A whole `Settings` document.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self")]
pub(crate) struct SettingsDoc {
    #[serde(rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    #[serde(rename = "kind")]
    _kind: Option<IgnoredAny>,
    #[serde(rename = "metadata")]
    _metadata: Option<ObjectMeta>,
    spec: Option<SettingsSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct SettingsSpec {
    dns: Option<DnsSpec>,
    breakers: Option<BreakersSpec>,
    gc_interval: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct DnsSpec {
    #[serde(rename = "minTTL")]
    min_ttl: Option<Spanned<Scalar>>,
    #[serde(rename = "maxIPsPerHostname")]
    max_ips_per_hostname: Option<Spanned<Scalar>>,
    max_deferred_connection_deletes: Option<Spanned<Scalar>>,
    proxy_response_max_delay: Option<Text>,
    reject_response_code: Option<Text>,
    concurrency_limit: Option<Spanned<Scalar>>,
    threads: Option<Spanned<Scalar>>,
    preallocate_identities: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
struct BreakersSpec {
    #[serde(rename = "maxFQDNIdentities")]
    max_fqdn_identities: Option<Spanned<Scalar>>,
    #[serde(rename = "maxIPsPerName")]
    max_ips_per_name: Option<Spanned<Scalar>>,
    max_names_per_endpoint: Option<Spanned<Scalar>>,
    max_cache_entries: Option<Spanned<Scalar>>,
}

shape!(SettingsDoc, SettingsSpec, DnsSpec, BreakersSpec,);

/// Largest count accepted: far beyond any sane setting, and fits `usize` on every target.
const MAX_COUNT: i128 = u32::MAX as i128;

/// Converts the `Settings` document; `None` if anything in it is wrong.
pub(crate) fn settings(doc: &SettingsDoc, diag: &mut Diag<'_>) -> Option<Settings> {
    let before = diag.count();
    let mut s = Settings::default();
    let Some(spec) = &doc.spec else {
        return Some(s);
    };

    let count = |field: &str, v: &Option<Spanned<Scalar>>, min: i128, diag: &mut Diag<'_>| {
        v.as_ref()
            .and_then(|v| int_in_range(field, v, min, MAX_COUNT, diag))
            .and_then(|n| usize::try_from(n).ok())
    };

    if let Some(dns) = &spec.dns {
        if let Some(v) = dns
            .min_ttl
            .as_ref()
            .and_then(|v| int_in_range("minTTL", v, 0, u32::MAX.into(), diag))
        {
            s.min_ttl = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(n) = count("maxIPsPerHostname", &dns.max_ips_per_hostname, 1, diag) {
            s.max_ips_per_hostname = n;
        }
        if let Some(n) = count(
            "maxDeferredConnectionDeletes",
            &dns.max_deferred_connection_deletes,
            0,
            diag,
        ) {
            s.max_deferred_connection_deletes = n;
        }
        if let Some(text) = &dns.proxy_response_max_delay
            && let Some(d) = duration("proxyResponseMaxDelay", text, diag)
        {
            if d > MAX_PROXY_RESPONSE_DELAY {
                diag.invalid(
                    at(text),
                    format!(
                        "`proxyResponseMaxDelay` {} is too long: at most {} (clients would \
                         give up on the answer first)",
                        humantime::format_duration(d),
                        humantime::format_duration(MAX_PROXY_RESPONSE_DELAY)
                    ),
                );
            } else {
                s.proxy_response_max_delay = d;
            }
        }
        if let Some(text) = &dns.reject_response_code {
            match text.value.as_str() {
                "refused" => s.reject_response_code = RejectCode::Refused,
                "nameError" => s.reject_response_code = RejectCode::NxDomain,
                other => diag.invalid(
                    at(text),
                    format!(
                        "`rejectResponseCode` {:?}: expected `refused` or `nameError`",
                        sanitize(other)
                    ),
                ),
            }
        }
        if let Some(n) = count("concurrencyLimit", &dns.concurrency_limit, 0, diag) {
            s.concurrency_limit = n;
        }
        if let Some(n) = count("threads", &dns.threads, 1, diag) {
            s.dns_threads = Some(n);
        }
        if let Some(b) = dns.preallocate_identities {
            s.preallocate_identities = b;
        }
    }
    if let Some(b) = &spec.breakers {
        if let Some(n) = count("maxFQDNIdentities", &b.max_fqdn_identities, 1, diag) {
            s.max_fqdn_identities = n;
        }
        if let Some(n) = count("maxIPsPerName", &b.max_ips_per_name, 1, diag) {
            s.max_ips_per_name = n;
        }
        if let Some(n) = count("maxNamesPerEndpoint", &b.max_names_per_endpoint, 1, diag) {
            s.max_names_per_endpoint = n;
        }
        if let Some(n) = count("maxCacheEntries", &b.max_cache_entries, 1, diag) {
            s.max_cache_entries = n;
        }
    }
    if let Some(text) = &spec.gc_interval
        && let Some(d) = duration("gcInterval", text, diag)
    {
        if d < MIN_GC_INTERVAL {
            diag.invalid(at(text), "`gcInterval` must be at least 1s");
        } else {
            s.gc_interval = d;
        }
    }
    (diag.count() == before).then_some(s)
}
