//! The admin API: HTTP/1.1 with JSON on a Unix socket (mode 0600), and the CLI commands that
//! read it (`fqdnd status`, `cache list`, `identity list`, `ipcache list`, `policy reload`).
//!
//! | method | path | returns |
//! |---|---|---|
//! | GET | `/v1/status` | [`Status`] |
//! | GET | `/v1/cache` | [`CacheRow`]s: Cilium's `fqdn cache list` columns |
//! | GET | `/v1/identities` | [`IdentityRow`]s |
//! | GET | `/v1/ipcache` | [`IpcacheRow`]s |
//! | POST | `/v1/policy/reload` | [`Reload`]: the old policy stays if the new one has errors |
//! | GET | `/v1/endpoints` | node: [`EndpointRow`]s |
//! | POST | `/v1/endpoints` | node: body = one `kind: Endpoint` YAML document; adds or replaces it |
//! | DELETE | `/v1/endpoints/{id}` | node: removes an endpoint added through the API |
//! | GET | `/v1/services` | node: [`ServiceRow`]s (backend ids, rev-NAT index) |
//! | POST | `/v1/services` | node: body = one `kind: Service` YAML document; sets it |
//! | DELETE | `/v1/services/{name}` | node: removes a service added through the API |
//! | GET | `/v1/drops?since=N` | node: [`DropPage`], policy drops after sequence number N |

use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use axum::Json;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use fqdnd_config::Gateway;
use fqdnd_ipcache::EndpointId;
use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;

use crate::clock::Clock;
use crate::gateway::observer::SharedEngine;
use crate::gateway::policy::{CompiledPolicy, GatewayPolicy};
use crate::node::{DropPage, EndpointRow, NodeRuntime, ServiceRow};

/// Which daemon the admin API belongs to.
pub(crate) enum AdminMode {
    /// `fqdnd gateway`, with the Gateway document it started with and, when it enforces LAN
    /// interfaces, its kernel side.
    Gateway {
        /// The Gateway document it started with.
        gateway: Box<Gateway>,
        /// The kernel side, if enforcing.
        kernel: Option<Arc<Mutex<crate::kernel::Kernel>>>,
    },
    /// `fqdnd node`.
    Node(Arc<NodeRuntime>),
}

/// What the admin API serves from.
pub(crate) struct AdminState {
    pub(crate) engine: SharedEngine,
    pub(crate) policy: Arc<GatewayPolicy>,
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) demo: bool,
    pub(crate) clock: Clock,
    pub(crate) proxy: fqdnd_dnsproxy::StatsHandle,
    pub(crate) mode: AdminMode,
    pub(crate) listen: Vec<std::net::SocketAddr>,
    pub(crate) reloads: Mutex<ReloadHistory>,
}

/// The last reload's outcome.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(crate) struct ReloadHistory {
    pub(crate) reloads: u64,
    pub(crate) failed: u64,
    pub(crate) last_errors: Vec<String>,
}

/// `GET /v1/status`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Status {
    pub(crate) version: String,
    pub(crate) uptime_seconds: u64,
    pub(crate) config: Vec<String>,
    pub(crate) listen: Vec<String>,
    pub(crate) queries: Vec<(String, u64)>,
    pub(crate) upstreams: Vec<UpstreamRow>,
    pub(crate) cache_names: usize,
    pub(crate) cache_entries: usize,
    pub(crate) cache_zombies: usize,
    pub(crate) identities: usize,
    pub(crate) fqdn_identities: usize,
    pub(crate) ipcache_prefixes: usize,
    pub(crate) breaker_trips: u64,
    pub(crate) deny_list_patterns: usize,
    pub(crate) allow_list_patterns: usize,
    pub(crate) reloads: ReloadHistory,
}

/// One upstream's health.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct UpstreamRow {
    pub(crate) addr: String,
    pub(crate) alive: bool,
    pub(crate) failures: u32,
    pub(crate) rtt_us: Option<u64>,
}

/// One row of `fqdnd cache list`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CacheRow {
    pub(crate) endpoint: String,
    pub(crate) source: String,
    pub(crate) fqdn: String,
    pub(crate) ttl: u32,
    pub(crate) expiration_time: String,
    pub(crate) ips: Vec<String>,
}

/// One row of `fqdnd identity list`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct IdentityRow {
    pub(crate) identity: u32,
    pub(crate) labels: Vec<String>,
    pub(crate) refs: u32,
}

/// One row of `fqdnd ipcache list`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct IpcacheRow {
    pub(crate) prefix: String,
    pub(crate) identity: u32,
    pub(crate) owners: Vec<String>,
}

/// `POST /v1/policy/reload`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Reload {
    pub(crate) ok: bool,
    pub(crate) errors: Vec<String>,
}

/// Binds the admin socket with mode 0600, replacing a stale socket file.
pub(crate) fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("{} is in use: is another fqdnd running?", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding the admin socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("setting mode 0600 on {}", path.display()))?;
    Ok(listener)
}

/// Serves the API until `shutdown`.
pub(crate) async fn serve(
    listener: UnixListener,
    state: Arc<AdminState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let app = axum::Router::new()
        .route("/v1/status", get(status))
        .route("/v1/cache", get(cache))
        .route("/v1/identities", get(identities))
        .route("/v1/ipcache", get(ipcache))
        .route("/v1/policy/reload", post(reload_handler))
        .route("/v1/endpoints", get(endpoints).post(add_endpoint))
        .route("/v1/endpoints/{id}", delete(remove_endpoint))
        .route("/v1/services", get(services).post(set_service))
        .route("/v1/services/{name}", delete(remove_service))
        .route("/v1/drops", get(drops))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("admin API")
}

async fn status(State(state): State<Arc<AdminState>>) -> Json<Status> {
    Json(status_of(&state))
}

pub(crate) fn status_of(state: &AdminState) -> Status {
    let proxy = state.proxy.stats();
    let (deny, allow) = state.policy.current().list_sizes();
    let reloads = state.reloads.lock().map(|r| r.clone()).unwrap_or_default();
    let engine = state.engine.lock();
    let (cache_names, cache_entries, cache_zombies, identities, fqdn_identities, prefixes, trips) =
        match &engine {
            Ok(e) => (
                e.names.name_count(),
                e.names.mapping_count(),
                e.names.zombie_count(),
                e.ipcache.allocator().len(),
                e.ipcache.allocator().from_dns_live(),
                e.ipcache.prefix_count(),
                e.names.stats().breaker_trips,
            ),
            Err(_) => Default::default(),
        };
    Status {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_seconds: state.clock.now().as_secs(),
        config: if state.demo {
            vec!["<embedded gateway demo>".to_owned()]
        } else {
            state
                .paths
                .iter()
                .map(|p| p.display().to_string())
                .collect()
        },
        listen: state.listen.iter().map(ToString::to_string).collect(),
        queries: proxy
            .queries
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), *v))
            .collect(),
        upstreams: proxy
            .upstreams
            .iter()
            .map(|u| UpstreamRow {
                addr: u.addr.to_string(),
                alive: u.alive,
                failures: u.consecutive_failures,
                rtt_us: u
                    .last_rtt
                    .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            })
            .collect(),
        cache_names,
        cache_entries,
        cache_zombies,
        identities,
        fqdn_identities,
        ipcache_prefixes: prefixes,
        breaker_trips: trips,
        deny_list_patterns: deny,
        allow_list_patterns: allow,
        reloads,
    }
}

async fn cache(State(state): State<Arc<AdminState>>) -> Json<Vec<CacheRow>> {
    Json(cache_rows(&state.engine, state.clock))
}

/// Rows in Cilium's `fqdn cache list` shape: one per (endpoint, name, source).
/// (endpoint, name, source) → (TTL, expiry, IPs), while building cache rows.
type CacheRows<'a> = std::collections::BTreeMap<(String, String, &'a str), (u32, u32, Vec<String>)>;

pub(crate) fn cache_rows(engine: &SharedEngine, clock: Clock) -> Vec<CacheRow> {
    let Ok(engine) = engine.lock() else {
        return Vec::new();
    };
    let mut rows = CacheRows::new();
    for entry in engine.names.entries() {
        let source = if entry.zombie { "connection" } else { "lookup" };
        let endpoints = engine.names.endpoints_of(&entry.name);
        let endpoints = if endpoints.is_empty() {
            vec!["-".to_owned()]
        } else {
            endpoints.iter().map(ToString::to_string).collect()
        };
        for endpoint in endpoints {
            let row = rows
                .entry((endpoint, entry.name.to_string(), source))
                .or_insert((0, 0, Vec::new()));
            row.0 = row
                .0
                .max(entry.ip.expires.saturating_sub(entry.last_lookup));
            row.1 = row.1.max(entry.ip.expires);
            row.2.push(entry.ip.addr.to_string());
        }
    }
    rows.into_iter()
        .map(|((endpoint, fqdn, source), (ttl, expires, mut ips))| {
            ips.sort();
            CacheRow {
                endpoint,
                source: source.to_owned(),
                fqdn,
                ttl,
                expiration_time: clock
                    .wall_time_of(std::time::Duration::from_secs(u64::from(expires))),
                ips,
            }
        })
        .collect()
}

async fn identities(State(state): State<Arc<AdminState>>) -> Json<Vec<IdentityRow>> {
    Json(identity_rows(&state.engine))
}

/// Every identity with its labels.
pub(crate) fn identity_rows(engine: &SharedEngine) -> Vec<IdentityRow> {
    let Ok(engine) = engine.lock() else {
        return Vec::new();
    };
    let mut rows: Vec<IdentityRow> = engine
        .ipcache
        .allocator()
        .iter()
        .map(|(id, _, refs)| IdentityRow {
            identity: id.0,
            labels: engine
                .ipcache
                .labels_of(id)
                .unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect(),
            refs,
        })
        .collect();
    rows.sort_by_key(|r| r.identity);
    rows
}

async fn ipcache(State(state): State<Arc<AdminState>>) -> Json<Vec<IpcacheRow>> {
    Json(ipcache_rows(&state.engine))
}

/// Every prefix with an identity.
pub(crate) fn ipcache_rows(engine: &SharedEngine) -> Vec<IpcacheRow> {
    let Ok(engine) = engine.lock() else {
        return Vec::new();
    };
    engine
        .ipcache
        .prefixes()
        .filter_map(|(prefix, identity, owners)| {
            Some(IpcacheRow {
                prefix: prefix.to_string(),
                identity: identity?.0,
                owners: owners.iter().map(ToString::to_string).collect(),
            })
        })
        .collect()
}

type ApiError = (StatusCode, String);

fn node_only(state: &AdminState) -> Result<&Arc<NodeRuntime>, ApiError> {
    match &state.mode {
        AdminMode::Node(runtime) => Ok(runtime),
        AdminMode::Gateway { .. } => Err((
            StatusCode::NOT_FOUND,
            "only `fqdnd node` manages endpoints, services and datapath drops".to_owned(),
        )),
    }
}

fn bad_request(e: &anyhow::Error) -> ApiError {
    (StatusCode::BAD_REQUEST, format!("{e:#}"))
}

async fn endpoints(
    State(state): State<Arc<AdminState>>,
) -> Result<Json<Vec<EndpointRow>>, ApiError> {
    let runtime = node_only(&state)?;
    runtime
        .rows(&state.engine)
        .map(Json)
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))
}

/// Runs a change of the node's state off the async threads (it writes kernel maps and
/// files); its error is the client's (400).
async fn node_change<T: Send + 'static>(
    state: Arc<AdminState>,
    change: impl FnOnce(&NodeRuntime, &AdminState) -> Result<T, anyhow::Error> + Send + 'static,
) -> Result<T, ApiError> {
    let runtime = Arc::clone(node_only(&state)?);
    tokio::task::spawn_blocking(move || change(&runtime, &state))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| bad_request(&e))
}

fn done() -> Json<Reload> {
    Json(Reload {
        ok: true,
        errors: Vec::new(),
    })
}

async fn add_endpoint(
    State(state): State<Arc<AdminState>>,
    body: String,
) -> Result<Json<EndpointRow>, ApiError> {
    node_change(state, move |runtime, state| {
        runtime.add_endpoint(&body, state)
    })
    .await
    .map(Json)
}

async fn remove_endpoint(
    State(state): State<Arc<AdminState>>,
    UrlPath(id): UrlPath<u16>,
) -> Result<Json<Reload>, ApiError> {
    node_change(state, move |runtime, state| {
        runtime.remove_endpoint(EndpointId(id), state)
    })
    .await
    .map(|()| done())
}

async fn services(State(state): State<Arc<AdminState>>) -> Result<Json<Vec<ServiceRow>>, ApiError> {
    node_only(&state)?
        .service_rows()
        .map(Json)
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))
}

async fn set_service(
    State(state): State<Arc<AdminState>>,
    body: String,
) -> Result<Json<ServiceRow>, ApiError> {
    node_change(state, move |runtime, _| runtime.set_service(&body))
        .await
        .map(Json)
}

async fn remove_service(
    State(state): State<Arc<AdminState>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<Reload>, ApiError> {
    node_change(state, move |runtime, _| runtime.remove_service(&name))
        .await
        .map(|()| done())
}

/// `?since=N`.
#[derive(Debug, Deserialize)]
struct Since {
    #[serde(default)]
    since: u64,
}

async fn drops(
    State(state): State<Arc<AdminState>>,
    Query(q): Query<Since>,
) -> Result<Json<DropPage>, ApiError> {
    Ok(Json(node_only(&state)?.drops.page(q.since, 1000)))
}

async fn reload_handler(State(state): State<Arc<AdminState>>) -> Json<Reload> {
    Json(reload(&state))
}

/// Reloads the configuration files. Everything is loaded and compiled first; only a policy
/// without errors replaces the one in force.
pub(crate) fn reload(state: &AdminState) -> Reload {
    let outcome = match &state.mode {
        AdminMode::Gateway { gateway, kernel } => reload_gateway(state, gateway, kernel.as_deref()),
        AdminMode::Node(runtime) => runtime.reload(state),
    };
    record_reload(state, outcome)
}

fn reload_gateway(
    state: &AdminState,
    current: &Gateway,
    kernel: Option<&Mutex<crate::kernel::Kernel>>,
) -> Result<()> {
    let (config, gateway) = crate::gateway::load(&state.paths, state.demo)?;
    crate::perms::check(
        &state.paths,
        &config,
        &gateway.daemon,
        &gateway.static_zones,
    );
    let compiled = CompiledPolicy::compile(&config, &gateway.daemon.lists)?;
    if gateway.listen != current.listen
        || gateway.upstreams != current.upstreams
        || gateway.static_zones != current.static_zones
    {
        tracing::warn!("listen addresses, upstreams and static zones change only on restart");
    }
    let mut engine = state
        .engine
        .lock()
        .map_err(|_| anyhow::anyhow!("engine lock poisoned"))?;
    engine.ipcache.set_endpoints(config.endpoints.clone())?;
    engine.set_policy(config.rules.clone(), state.clock.now())?;
    if let Some(kernel) = kernel {
        let clients = crate::gateway::clients(&config, &engine);
        kernel
            .lock()
            .map_err(|_| anyhow::anyhow!("kernel lock poisoned"))?
            .sync_gateway(&current.enforce_interfaces, &clients)?;
    }
    state.policy.replace(compiled);
    Ok(())
}

fn record_reload(state: &AdminState, outcome: Result<()>) -> Reload {
    let mut history = state
        .reloads
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    history.reloads += 1;
    match outcome {
        Ok(()) => {
            history.last_errors.clear();
            tracing::info!("policy reloaded");
            Reload {
                ok: true,
                errors: Vec::new(),
            }
        }
        Err(e) => {
            history.failed += 1;
            let errors: Vec<String> = format!("{e:#}").lines().map(str::to_owned).collect();
            for line in &errors {
                tracing::error!(error = %line, "reload rejected; the previous policy stays in force");
            }
            history.last_errors = errors.clone();
            Reload { ok: false, errors }
        }
    }
}

/// A blocking request to the admin socket; returns the JSON body.
pub(crate) fn request(socket: &Path, method: &str, path: &str) -> Result<String> {
    request_with_body(socket, method, path, "")
}

/// [`request`] with a request body; a non-200 answer's body is the error.
pub(crate) fn request_with_body(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> Result<String> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).with_context(|| {
        format!(
            "connecting to the admin socket {} (is `fqdnd gateway` running? see --admin-socket)",
            socket.display()
        )
    })?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: fqdnd\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .context("reading the admin API's answer")?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    let status = head.lines().next().unwrap_or_default();
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    if !status.contains(" 200 ") {
        bail!("admin API answered {status}: {}", body.trim());
    }
    Ok(body)
}

fn dechunk(mut body: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("malformed chunk")?;
        let size = usize::from_str_radix(size.trim(), 16).context("malformed chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).context("short chunk")?);
        body = rest.get(size + 2..).context("short chunk")?;
    }
}
