//! The admin API server (axum on a Unix socket), reading the daemon's shared state.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use crate::{Context, Result, bail};
use axum::Json;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use fqdnd_engine::Clock as _;
use fqdnd_engine::explain::{Explanation, Flow};
use fqdnd_engine::view::{CacheRow, IdentityRow, IpcacheRow};
use fqdnd_ipcache::EndpointId;
use fqdnd_ipcache::policy::Direction;
use serde::Deserialize;
use tokio::net::UnixListener;

use super::{AnswerCacheRow, ForgetOutcome, ForgetRequest, Reload, Status, UpstreamRow};
use crate::node::{CniAttachment, DropPage, EndpointRow, NodeMode, NodeRuntime, ServiceRow};
use crate::skeleton::ForgetError;
use crate::skeleton::record::{RecordRequest, RecordStatus};
use crate::skeleton::{Running, Shared};

/// Binds the admin socket with mode 0600, replacing a stale socket file.
pub fn bind(path: &Path) -> Result<UnixListener> {
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

/// Serves the admin API of `running` on its socket (mode 0600) and reloads the policy on
/// SIGHUP; nothing for the demo (no socket).
pub fn spawn(running: &mut Running) -> Result<()> {
    let Some(socket) = running.admin_socket.clone() else {
        return Ok(());
    };
    let listener = bind(&socket)?;
    {
        let shared = Arc::clone(&running.shared);
        let mut stopped = running.stopped.clone();
        running.tasks.spawn(async move {
            serve(listener, shared, async move {
                let _ = stopped.changed().await;
            })
            .await
        });
    }
    let shared = Arc::clone(&running.shared);
    let mut stopped = running.stopped.clone();
    // Installed before the daemon says it is ready: a SIGHUP (`systemctl reload`) right after
    // start reloads, it does not kill the daemon with the signal's default action.
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    running.tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = hangup.recv() => {
                    tracing::info!("SIGHUP: reloading policy");
                    crate::notify::reloading();
                    let shared = Arc::clone(&shared);
                    // A reload writes kernel maps and reads files: off the async threads.
                    let outcome = tokio::task::spawn_blocking(move || shared.reload()).await;
                    crate::notify::reloaded(match &outcome {
                        Ok(r) if r.ok => "policy reloaded",
                        _ => "policy reload refused: the policy in force stays (see the log)",
                    });
                }
                _ = stopped.changed() => return Ok(()),
            }
        }
    });
    Ok(())
}

/// Serves the API until `shutdown`.
pub async fn serve(
    listener: UnixListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let app = axum::Router::new()
        .route("/v1/status", get(status))
        .route("/v1/cache", get(cache))
        .route("/v1/cache/forget", post(forget))
        .route("/v1/identities", get(identities))
        .route("/v1/ipcache", get(ipcache))
        .route("/v1/policy/reload", post(reload))
        .route("/v1/policy/explain", get(explain))
        .route("/v1/endpoints", get(endpoints).post(add_endpoint))
        .route("/v1/endpoints/{id}", delete(remove_endpoint))
        .route("/v1/services", get(services).post(set_service))
        .route("/v1/services/{name}", delete(remove_service))
        .route("/v1/drops", get(drops))
        .route("/v1/cni", post(cni_add))
        .route("/v1/cni/{container}", delete(cni_del_all))
        .route("/v1/cni/{container}/{ifname}", get(cni_get).delete(cni_del))
        .route(
            "/v1/record",
            get(record_status).post(record_start).delete(record_stop),
        )
        .with_state(shared);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("admin API")
}

pub(crate) type ApiError = (StatusCode, String);

fn internal(e: &crate::Error) -> ApiError {
    (StatusCode::INTERNAL_SERVER_ERROR, crate::chain(e))
}

pub(crate) async fn status(State(shared): State<Arc<Shared>>) -> Json<Status> {
    Json(status_of(&shared))
}

/// The daemon's state for `fqdnd status`.
pub fn status_of(shared: &Shared) -> Status {
    let proxy = shared.proxy.get().map(|p| p.stats());
    let (deny, allow) = shared.dns.current().list_sizes();
    let reloads = shared.reloads.lock().map(|r| r.clone()).unwrap_or_default();
    let counts = shared.engine.lock().map(|e| e.counts()).unwrap_or_default();
    let cluster = shared
        .cluster
        .as_ref()
        .and_then(|c| shared.engine.lock().ok().map(|engine| c.status(&engine)));
    Status {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        mode: shared.mode.name().to_owned(),
        uptime_seconds: shared.clock.now().as_secs(),
        config: if shared.demo {
            vec!["<embedded gateway demo>".to_owned()]
        } else {
            shared
                .paths
                .iter()
                .map(|p| p.display().to_string())
                .collect()
        },
        listen: shared
            .listen
            .get()
            .into_iter()
            .flatten()
            .map(ToString::to_string)
            .collect(),
        encrypted: shared.encrypted.get().cloned().unwrap_or_default(),
        queries: proxy
            .iter()
            .flat_map(|p| &p.queries)
            .map(|(k, v)| (k.as_str().to_owned(), *v))
            .collect(),
        upstreams: proxy
            .iter()
            .flat_map(|p| &p.upstreams)
            .map(|u| UpstreamRow {
                addr: u.label.clone(),
                alive: u.alive,
                failures: u.consecutive_failures,
                rtt_us: u
                    .last_rtt
                    .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            })
            .collect(),
        cache_names: counts.cache_names,
        cache_entries: counts.cache_entries,
        cache_zombies: counts.cache_zombies,
        identities: counts.identities,
        fqdn_identities: counts.fqdn_identities,
        ipcache_prefixes: counts.ipcache_prefixes,
        breaker_trips: counts.breaker_trips,
        deny_list_patterns: deny,
        allow_list_patterns: allow,
        reloads,
        cluster,
        answer_cache: proxy
            .as_ref()
            .and_then(|p| p.cache)
            .map(|c| AnswerCacheRow {
                entries: c.entries,
                capacity: c.capacity,
                hits: c.hits,
                misses: c.misses,
                inserts: c.inserts,
                evictions: c.evictions,
                expired: c.expired,
            }),
    }
}

pub(crate) async fn cache(State(shared): State<Arc<Shared>>) -> Json<Vec<CacheRow>> {
    let rows = shared
        .engine
        .lock()
        .map(|e| e.cache_rows(&shared.clock))
        .unwrap_or_default();
    Json(rows)
}

async fn forget(
    State(shared): State<Arc<Shared>>,
    Json(request): Json<ForgetRequest>,
) -> Result<Json<ForgetOutcome>, ApiError> {
    shared
        .forget(&request)
        .await
        .map(Json)
        .map_err(|e| match e {
            ForgetError::Request(m) => (StatusCode::BAD_REQUEST, m),
            ForgetError::Daemon(m) => (StatusCode::INTERNAL_SERVER_ERROR, m),
        })
}

pub(crate) async fn identities(State(shared): State<Arc<Shared>>) -> Json<Vec<IdentityRow>> {
    Json(
        shared
            .engine
            .lock()
            .map(|e| e.identity_rows())
            .unwrap_or_default(),
    )
}

pub(crate) async fn ipcache(State(shared): State<Arc<Shared>>) -> Json<Vec<IpcacheRow>> {
    Json(
        shared
            .engine
            .lock()
            .map(|e| e.ipcache_rows())
            .unwrap_or_default(),
    )
}

async fn reload(State(shared): State<Arc<Shared>>) -> Result<Json<Reload>, ApiError> {
    // A reload reads files and writes kernel maps: off the async threads.
    tokio::task::spawn_blocking(move || shared.reload())
        .await
        .map(Json)
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// `GET /v1/policy/explain?endpoint=ID&direction=egress|ingress&peer=ADDR&protocol=P&port=N`.
#[derive(Debug, Deserialize)]
pub(crate) struct ExplainQuery {
    endpoint: u16,
    #[serde(default)]
    direction: Option<String>,
    peer: std::net::IpAddr,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    port: u16,
}

pub(crate) async fn explain(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<ExplainQuery>,
) -> Result<Json<Explanation>, ApiError> {
    let bad = |m: String| (StatusCode::BAD_REQUEST, m);
    let direction = match q.direction.as_deref().unwrap_or("egress") {
        "egress" => Direction::Egress,
        "ingress" => Direction::Ingress,
        other => return Err(bad(format!("direction {other:?}: egress or ingress"))),
    };
    let protocol = fqdnd_engine::explain::parse_protocol(q.protocol.as_deref().unwrap_or("any"))
        .map_err(bad)?;
    fqdnd_engine::explain::check_port(q.peer, protocol, q.port).map_err(bad)?;
    let flow = Flow {
        endpoint: EndpointId(q.endpoint),
        direction,
        peer: q.peer,
        protocol,
        port: q.port,
    };
    let engine = shared.engine.lock().map_err(|_| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the engine's lock is poisoned".to_owned(),
        )
    })?;
    Ok(Json(fqdnd_engine::explain::explain(&engine.ipcache, flow)))
}

pub(crate) fn node_only(shared: &Shared) -> Result<&Arc<NodeRuntime>, ApiError> {
    match shared.mode.as_any().downcast_ref::<NodeMode>() {
        Some(NodeMode(runtime)) => Ok(runtime),
        None => Err((
            StatusCode::NOT_FOUND,
            "only `fqdnd node` manages endpoints, services and datapath drops".to_owned(),
        )),
    }
}

async fn endpoints(State(shared): State<Arc<Shared>>) -> Result<Json<Vec<EndpointRow>>, ApiError> {
    let runtime = node_only(&shared)?;
    runtime.rows(&shared).map(Json).map_err(|e| internal(&e))
}

/// Runs a change of the node's state off the async threads (it writes kernel maps and
/// files); its error is the client's (400).
async fn node_change<T: Send + 'static>(
    shared: Arc<Shared>,
    change: impl FnOnce(&NodeRuntime, &Shared) -> Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let runtime = Arc::clone(node_only(&shared)?);
    tokio::task::spawn_blocking(move || change(&runtime, &shared))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| (StatusCode::BAD_REQUEST, crate::chain(&e)))
}

fn done() -> Json<Reload> {
    Json(Reload {
        ok: true,
        errors: Vec::new(),
    })
}

async fn add_endpoint(
    State(shared): State<Arc<Shared>>,
    body: String,
) -> Result<Json<EndpointRow>, ApiError> {
    node_change(shared, move |runtime, shared| {
        runtime.add_endpoint(shared, &body)
    })
    .await
    .map(Json)
}

async fn remove_endpoint(
    State(shared): State<Arc<Shared>>,
    UrlPath(id): UrlPath<u16>,
) -> Result<Json<Reload>, ApiError> {
    node_change(shared, move |runtime, shared| {
        runtime.remove_endpoint(shared, EndpointId(id))
    })
    .await
    .map(|()| done())
}

async fn services(State(shared): State<Arc<Shared>>) -> Result<Json<Vec<ServiceRow>>, ApiError> {
    node_only(&shared)?
        .service_rows()
        .map(Json)
        .map_err(|e| internal(&e))
}

async fn set_service(
    State(shared): State<Arc<Shared>>,
    body: String,
) -> Result<Json<ServiceRow>, ApiError> {
    node_change(shared, move |runtime, _| runtime.set_service(&body))
        .await
        .map(Json)
}

async fn remove_service(
    State(shared): State<Arc<Shared>>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<Reload>, ApiError> {
    node_change(shared, move |runtime, _| runtime.remove_service(&name))
        .await
        .map(|()| done())
}

/// `?since=N`.
#[derive(Debug, Deserialize)]
pub(crate) struct Since {
    #[serde(default)]
    since: u64,
}

pub(crate) async fn drops(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<Since>,
) -> Result<Json<DropPage>, ApiError> {
    Ok(Json(node_only(&shared)?.drops.page(q.since, 1000)))
}

async fn record_status(State(shared): State<Arc<Shared>>) -> Json<RecordStatus> {
    Json(shared.recorder.status())
}

async fn record_start(
    State(shared): State<Arc<Shared>>,
    Json(request): Json<RecordRequest>,
) -> Result<Json<RecordStatus>, ApiError> {
    shared
        .recorder
        .start(&request, shared.mode.name())
        .map(Json)
        .map_err(|e| (StatusCode::BAD_REQUEST, crate::chain(&e)))
}

async fn record_stop(State(shared): State<Arc<Shared>>) -> Result<Json<RecordStatus>, ApiError> {
    // Waits for the writer to drain the queue and close the files: off the async threads.
    tokio::task::spawn_blocking(move || shared.recorder.stop())
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map(Json)
        .map_err(|e| (StatusCode::BAD_REQUEST, crate::chain(&e)))
}

async fn cni_add(
    State(shared): State<Arc<Shared>>,
    Json(attachment): Json<CniAttachment>,
) -> Result<Json<EndpointRow>, ApiError> {
    node_change(shared, move |runtime, shared| {
        runtime.cni_add(shared, &attachment)
    })
    .await
    .map(Json)
}

/// CNI DEL of one attachment.
async fn cni_del(
    State(shared): State<Arc<Shared>>,
    UrlPath((container, ifname)): UrlPath<(String, String)>,
) -> Result<Json<Reload>, ApiError> {
    node_change(shared, move |runtime, shared| {
        runtime.cni_del(shared, &container, Some(&ifname))
    })
    .await
    .map(|()| done())
}

/// CNI DEL without `CNI_IFNAME`: every attachment of the container.
async fn cni_del_all(
    State(shared): State<Arc<Shared>>,
    UrlPath(container): UrlPath<String>,
) -> Result<Json<Reload>, ApiError> {
    node_change(shared, move |runtime, shared| {
        runtime.cni_del(shared, &container, None)
    })
    .await
    .map(|()| done())
}

async fn cni_get(
    State(shared): State<Arc<Shared>>,
    UrlPath((container, ifname)): UrlPath<(String, String)>,
) -> Result<Json<EndpointRow>, ApiError> {
    let runtime = node_only(&shared)?;
    match runtime.cni_get(&shared, &container, &ifname) {
        Ok(Some(row)) => Ok(Json(row)),
        Ok(None) => Err((
            StatusCode::NOT_FOUND,
            format!("no endpoint for container {container} on {ifname}"),
        )),
        Err(e) => Err((StatusCode::BAD_REQUEST, crate::chain(&e))),
    }
}
