//! `kind: Gateway` (`apiVersion: fqdnd.io/v1`): fqdnd as a standalone DNS firewall. At most
//! one such document across all files; paths are relative to the file that names them.
//!
//! ```yaml
//! apiVersion: fqdnd.io/v1
//! kind: Gateway
//! spec:
//!   listen: ["127.0.0.1:53", "[::1]:53"]    # UDP and TCP
//!   upstreams: ["192.0.2.53:53"]             # a health-checked pool
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
//!   upstreamTimeout: 5s
//!   onUpstreamTimeout: servfail               # or noReply (Cilium)
//!   onHoldTimeout: release                    # or servfail
//!   onTruncated: retryTcp                     # or passThrough
//!   rateLimit: {qps: 200, burst: 400, action: drop}   # per client address; or refused
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

use fqdnd_dnsproxy::{HoldFallback, RateLimitAction, TruncatedAction, UpstreamTimeoutAction};

use crate::cnp::ObjectMeta;
use crate::yaml::{Diag, Text, at, duration, sanitize};

/// Where the admin API listens unless told otherwise.
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/fqdnd/admin.sock";

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

/// The gateway's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// Addresses served over UDP and TCP.
    pub listen: Vec<SocketAddr>,
    /// The upstream pool.
    pub upstreams: Vec<SocketAddr>,
    /// Zones served from memory, as an upstream of their own.
    pub static_zones: Vec<StaticZone>,
    /// Allow and deny lists.
    pub lists: Lists,
    /// The admin API's Unix socket.
    pub admin_socket: PathBuf,
    /// The Prometheus endpoint, if any.
    pub metrics: Option<SocketAddr>,
    /// The JSON-lines query log, if any.
    pub query_log: Option<PathBuf>,
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
}

impl Default for Gateway {
    fn default() -> Self {
        Self {
            listen: Vec::new(),
            upstreams: Vec::new(),
            static_zones: Vec::new(),
            lists: Lists::default(),
            admin_socket: PathBuf::from(DEFAULT_ADMIN_SOCKET),
            metrics: None,
            query_log: None,
            upstream_timeout: Duration::from_secs(5),
            on_upstream_timeout: UpstreamTimeoutAction::default(),
            on_hold_timeout: HoldFallback::default(),
            on_truncated: TruncatedAction::default(),
            rate_limit: None,
        }
    }
}

/// A whole `Gateway` document.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GatewayDoc {
    #[serde(rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    #[serde(rename = "kind")]
    _kind: Option<IgnoredAny>,
    #[serde(rename = "metadata")]
    _metadata: Option<ObjectMeta>,
    spec: Option<GatewaySpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GatewaySpec {
    listen: Option<Vec<Text>>,
    upstreams: Option<Vec<Text>>,
    static_zones: Option<Vec<Spanned<ZoneSpec>>>,
    lists: Option<ListsSpec>,
    admin_socket: Option<Text>,
    metrics: Option<Text>,
    query_log: Option<Text>,
    upstream_timeout: Option<Text>,
    on_upstream_timeout: Option<Text>,
    on_hold_timeout: Option<Text>,
    on_truncated: Option<Text>,
    rate_limit: Option<Spanned<RateLimitSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RateLimitSpec {
    qps: u32,
    burst: Option<u32>,
    clients: Option<u32>,
    action: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ZoneSpec {
    origin: Text,
    file: Option<Text>,
    records: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ListsSpec {
    deny: Option<Vec<Text>>,
    allow: Option<Vec<Text>>,
    deny_names: Option<Vec<String>>,
    allow_names: Option<Vec<String>>,
}

/// Converts the `Gateway` document; `None` if anything in it is wrong.
pub(crate) fn gateway(doc: &Spanned<GatewayDoc>, diag: &mut Diag<'_>) -> Option<Gateway> {
    let doc_at = at(doc);
    let doc = &doc.value;
    let before = diag.count();
    let mut g = Gateway::default();
    let base = diag
        .file()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let relative = |text: &Text| base.join(&text.value);
    let Some(spec) = &doc.spec else {
        diag.invalid(
            doc_at,
            "a `Gateway` needs a `spec` with `listen` and `upstreams` or `staticZones`",
        );
        return None;
    };
    for text in spec.listen.iter().flatten() {
        if let Some(addr) = socket_addr("listen", text, diag) {
            g.listen.push(addr);
        }
    }
    for text in spec.upstreams.iter().flatten() {
        if let Some(addr) = socket_addr("upstreams", text, diag) {
            g.upstreams.push(addr);
        }
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
    if let Some(lists) = &spec.lists {
        g.lists.deny = lists.deny.iter().flatten().map(relative).collect();
        g.lists.allow = lists.allow.iter().flatten().map(relative).collect();
        g.lists.deny_names = lists.deny_names.clone().unwrap_or_default();
        g.lists.allow_names = lists.allow_names.clone().unwrap_or_default();
    }
    if let Some(text) = &spec.admin_socket {
        g.admin_socket = relative(text);
    }
    if let Some(text) = &spec.metrics {
        g.metrics = socket_addr("metrics", text, diag);
    }
    if let Some(text) = &spec.query_log {
        g.query_log = Some(relative(text));
    }
    if let Some(text) = &spec.upstream_timeout
        && let Some(d) = duration("upstreamTimeout", text, diag)
    {
        if d.is_zero() || d > Duration::from_secs(60) {
            diag.invalid(at(text), "`upstreamTimeout` must be between 1ms and 60s");
        } else {
            g.upstream_timeout = d;
        }
    }
    if let Some(text) = &spec.on_upstream_timeout {
        match text.value.as_str() {
            "servfail" => g.on_upstream_timeout = UpstreamTimeoutAction::ServFail,
            "noReply" => g.on_upstream_timeout = UpstreamTimeoutAction::NoReply,
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
            "release" => g.on_hold_timeout = HoldFallback::Release,
            "servfail" => g.on_hold_timeout = HoldFallback::ServFail,
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
            "retryTcp" => g.on_truncated = TruncatedAction::RetryTcp,
            "passThrough" => g.on_truncated = TruncatedAction::PassThrough,
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
            g.rate_limit = Some(RateLimit {
                qps: r.qps,
                burst: r.burst.unwrap_or(r.qps).max(1),
                clients: r.clients.map_or(65_536, |c| c.max(1) as usize),
                action,
            });
        }
    }
    if diag.count() == before {
        if g.listen.is_empty() {
            diag.invalid(doc_at, "a `Gateway` needs at least one `listen` address");
        }
        if g.upstreams.is_empty() && g.static_zones.is_empty() {
            diag.invalid(
                doc_at,
                "a `Gateway` needs `upstreams`, `staticZones`, or both",
            );
        }
    }
    (diag.count() == before).then_some(g)
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

fn choice(field: &str, got: &str, expected: &str, text: &Text, diag: &mut Diag<'_>) {
    diag.invalid(
        at(text),
        format!("`{field}` {:?}: expected {expected}", sanitize(got)),
    );
}
