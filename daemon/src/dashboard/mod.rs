//! The dashboard: a read-only web view of the daemon, served over HTTP on the address of the
//! document's `dashboard` block (loopback by default). The pages (one HTML file, its script
//! and style, embedded in the binary) read the same data the admin API serves, under
//! `/api/`, and follow queries and drops live by Server-Sent Events. Everything a response
//! carries goes through [`guard`]: GET only, the bearer token on `/api/`, a strict
//! Content-Security-Policy, no CORS.
//!
//! | path | returns |
//! |---|---|
//! | `/`, `/app.js`, `/app.css`, `/favicon.svg` | the pages (no data: served without the token) |
//! | `/api/status` | the admin API's `Status` |
//! | `/api/cache`, `/api/identities`, `/api/ipcache` | the engine's listings |
//! | `/api/policy` | every endpoint or client group with the rules selecting it |
//! | `/api/explain?…` | `fqdnd policy explain`'s answer (the admin API's parameters) |
//! | `/api/drops?since=N` | node: the drop log |
//! | `/api/series?step=S` | queries per second by result, the last hour in buckets of S seconds |
//! | `/api/holds` | hold time p50/p99 over the last five minutes |
//! | `/api/events/queries` | SSE: the last queries, then each as it finishes |
//! | `/api/events/drops` | SSE (node): each drop as it is reported |

pub mod feed;
pub mod guard;
mod tail;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{FromRef, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::{broadcast, watch};

use crate::admin::server as admin;
use crate::skeleton::{Running, Shared};
use crate::{Context, Result, bail};
pub use feed::Feed;
pub use guard::Token;

/// The dashboard's handlers' state.
#[derive(Clone)]
struct Dash {
    shared: Arc<Shared>,
    feed: Arc<Feed>,
    stopped: watch::Receiver<bool>,
}

impl FromRef<Dash> for Arc<Shared> {
    fn from_ref(d: &Dash) -> Self {
        Arc::clone(&d.shared)
    }
}

/// Reads the token file: its first line, not empty. A file others or its group can read is
/// warned about (the etcd password file's rule).
pub fn read_token(path: &std::path::Path) -> Result<Token> {
    use std::os::unix::fs::PermissionsExt as _;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the dashboard token file {}", path.display()))?;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o044 != 0
    {
        tracing::warn!(file = %path.display(), mode = format_args!("{:o}", meta.permissions().mode() & 0o7777), "the dashboard token file is readable by its group or by everyone: make it readable by its owner only (chmod 600)");
    }
    match Token::parse(&text) {
        Some(token) => Ok(token),
        None => bail!("the dashboard token file {} is empty", path.display()),
    }
}

/// Serves the dashboard of `running` when its document has a `dashboard` block; the address
/// it listens on.
///
/// # Errors
/// The token file cannot be read or is empty, or the address cannot be bound.
pub fn spawn(running: &mut Running) -> Result<Option<std::net::SocketAddr>> {
    let (Some(config), Some(feed)) = (running.dashboard.clone(), running.shared.feed.clone())
    else {
        return Ok(None);
    };
    let token = config.token_file.as_deref().map(read_token).transpose()?;
    let listener = std::net::TcpListener::bind(config.address)
        .with_context(|| format!("binding the dashboard on {}", config.address))?;
    listener
        .set_nonblocking(true)
        .context("making the dashboard's socket non-blocking")?;
    let listener =
        tokio::net::TcpListener::from_std(listener).context("serving the dashboard's socket")?;
    let address = listener.local_addr().unwrap_or(config.address);
    tracing::info!(%address, token = token.is_some(), "dashboard");
    let app = router(
        Dash {
            shared: Arc::clone(&running.shared),
            feed,
            stopped: running.stopped.clone(),
        },
        token,
    );
    let mut stopped = running.stopped.clone();
    running.tasks.spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.changed().await;
            })
            .await
            .context("dashboard")
    });
    Ok(Some(address))
}

fn router(state: Dash, token: Option<Token>) -> axum::Router {
    let api = axum::Router::new()
        .route("/api/status", get(admin::status))
        .route("/api/cache", get(admin::cache))
        .route("/api/identities", get(admin::identities))
        .route("/api/ipcache", get(admin::ipcache))
        .route("/api/explain", get(admin::explain))
        .route("/api/drops", get(admin::drops))
        .route("/api/policy", get(policy))
        .route("/api/series", get(series))
        .route("/api/holds", get(holds))
        .route("/api/events/queries", get(query_events))
        .route("/api/events/drops", get(drop_events))
        .with_state(state);
    guarded(api.merge(assets(token.is_some())), token)
}

/// `app` behind [`guard::guard`], with a 404 for what it does not serve.
fn guarded(app: axum::Router, token: Option<Token>) -> axum::Router {
    app.fallback(|| async { (StatusCode::NOT_FOUND, "no such page\n") })
        .layer(axum::middleware::from_fn(move |request, next| {
            guard::guard(token.clone(), request, next)
        }))
}

/// The pages, embedded, and `/auth`: whether the API needs a token (so that the page asks for
/// it before its first request instead of after a refusal).
fn assets(needs_token: bool) -> axum::Router {
    fn asset(content_type: &'static str, body: &'static [u8]) -> axum::routing::MethodRouter {
        get(move || async move { ([(header::CONTENT_TYPE, content_type)], body) })
    }
    let html = asset(
        "text/html; charset=utf-8",
        include_bytes!("assets/index.html"),
    );
    axum::Router::new()
        .route("/", html.clone())
        .route("/index.html", html)
        .route(
            "/app.js",
            asset(
                "text/javascript; charset=utf-8",
                include_bytes!("assets/app.js"),
            ),
        )
        .route(
            "/app.css",
            asset("text/css; charset=utf-8", include_bytes!("assets/app.css")),
        )
        .route(
            "/auth",
            get(move || async move { Json(serde_json::json!({ "token": needs_token })) }),
        )
        .route(
            "/favicon.svg",
            asset("image/svg+xml", include_bytes!("assets/favicon.svg")),
        )
}

/// Unix milliseconds now, by the daemon's clock (the query records' time base).
fn unix_ms(shared: &Shared) -> u64 {
    use fqdnd_engine::Clock as _;
    shared.clock.unix_ms_of(shared.clock.now())
}

async fn policy(State(d): State<Dash>) -> Json<Vec<fqdnd_engine::explain::EndpointPolicy>> {
    Json(
        d.shared
            .engine
            .lock()
            .map(|e| fqdnd_engine::explain::policies(&e.ipcache))
            .unwrap_or_default(),
    )
}

#[derive(Debug, Deserialize)]
struct Step {
    #[serde(default = "ten")]
    step: u64,
}

const fn ten() -> u64 {
    10
}

async fn series(State(d): State<Dash>, Query(q): Query<Step>) -> Json<feed::Series> {
    Json(d.feed.series(unix_ms(&d.shared) / 1000, q.step))
}

async fn holds(State(d): State<Dash>) -> Json<feed::Holds> {
    Json(d.feed.holds(unix_ms(&d.shared)))
}

fn json_event(name: &str, value: &impl serde::Serialize) -> Event {
    Event::default()
        .event(name)
        .data(serde_json::to_string(value).unwrap_or_default())
}

/// Waits until the daemon stops.
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    while !*stopped.borrow() {
        if stopped.changed().await.is_err() {
            return;
        }
    }
}

/// The live tail: the last queries, then each one as it finishes; ends when the daemon stops
/// (so that stopping does not wait on an open page).
async fn query_events(State(d): State<Dash>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let backlog: std::collections::VecDeque<_> = d.feed.recent().into();
    let rx = d.feed.subscribe();
    let state = (backlog, rx, d.stopped.clone(), tail::Groups::default());
    let shared = Arc::clone(&d.shared);
    let stream = futures_util::stream::unfold(
        state,
        move |(mut backlog, mut rx, mut stopped, mut groups)| {
            let shared = Arc::clone(&shared);
            async move {
                let entry = match backlog.pop_front() {
                    Some(entry) => entry,
                    None => tokio::select! {
                        received = rx.recv() => match received {
                            Ok(entry) => entry,
                            Err(broadcast::error::RecvError::Lagged(n)) => {
                                let missed = Event::default().event("missed").data(n.to_string());
                                return Some((Ok(missed), (backlog, rx, stopped, groups)));
                            }
                            Err(broadcast::error::RecvError::Closed) => return None,
                        },
                        () = until_stopped(&mut stopped) => return None,
                    },
                };
                {
                    use fqdnd_engine::Clock as _;
                    groups.refresh(&shared, shared.clock.now());
                }
                let shown = tail::TailEntry {
                    entry: &entry,
                    group: groups.of(entry.client.ip()),
                };
                let event = json_event("query", &shown);
                Some((Ok(event), (backlog, rx, stopped, groups)))
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// How often the drop log is read for the live view.
const DROP_POLL: Duration = Duration::from_millis(500);

/// The drops as they are reported (node); 404 in a gateway.
async fn drop_events(State(d): State<Dash>) -> Response {
    let runtime = match admin::node_only(&d.shared) {
        Ok(runtime) => Arc::clone(runtime),
        Err(e) => return e.into_response(),
    };
    // From the first drop kept: the page shows the recent ones, then the new.
    let state = (0, std::collections::VecDeque::new(), d.stopped.clone());
    let stream = futures_util::stream::unfold(state, move |(mut since, mut queue, mut stopped)| {
        let runtime = Arc::clone(&runtime);
        async move {
            loop {
                if let Some(drop) = queue.pop_front() {
                    return Some((
                        Ok::<_, Infallible>(json_event("drop", &drop)),
                        (since, queue, stopped),
                    ));
                }
                let page = runtime.drops.page(since, 1000);
                since = page.next;
                if page.missed > 0 {
                    return Some((
                        Ok(Event::default()
                            .event("missed")
                            .data(page.missed.to_string())),
                        (since, page.drops.into(), stopped),
                    ));
                }
                queue = page.drops.into();
                if queue.is_empty() {
                    tokio::select! {
                        () = tokio::time::sleep(DROP_POLL) => {}
                        () = until_stopped(&mut stopped) => return None,
                    }
                }
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests;
