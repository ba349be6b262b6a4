//! The admin API client the CLI commands use: hyper's HTTP/1.1 client over the Unix socket,
//! and how a command finds the socket.
//!
//! The socket is, in order: `--admin-socket`; the `FQDND_ADMIN_SOCKET` environment variable;
//! the `adminSocket` of the `Gateway` or `Node` document in `--config`; else the default socket
//! of whichever daemon is running (`/run/fqdnd/gateway.sock`, `/run/fqdnd/node.sock`) — and if
//! both are, the command asks which.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Context, Result, bail, refused};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The socket a command talks to: `admin_socket` if given; else the `adminSocket` of the
/// `Gateway` or `Node` document in the `config` files; else the default socket of whichever
/// daemon is running.
///
/// # Errors
/// The configuration does not load or names both daemons; no daemon, or both, run.
pub fn socket(admin_socket: Option<&Path>, config: &[PathBuf]) -> Result<PathBuf> {
    if let Some(socket) = admin_socket {
        return Ok(socket.to_path_buf());
    }
    if !config.is_empty() {
        let config = fqdnd_config::load(config).map_err(|errors| {
            refused!("reading the admin socket from the configuration: {errors}")
        })?;
        return match (&config.gateway, &config.node) {
            (Some(g), None) => Ok(g.daemon.admin_socket.clone()),
            (None, Some(n)) => Ok(n.daemon.admin_socket.clone()),
            (None, None) => Ok(fqdnd_config::Node::default().daemon.admin_socket),
            (Some(g), Some(n)) => bail!(
                "the configuration has a `Gateway` ({}) and a `Node` ({}) document: say which with --admin-socket",
                g.daemon.admin_socket.display(),
                n.daemon.admin_socket.display()
            ),
        };
    }
    let defaults = [
        fqdnd_config::DEFAULT_GATEWAY_ADMIN_SOCKET,
        fqdnd_config::DEFAULT_NODE_ADMIN_SOCKET,
    ];
    let running: Vec<&str> = defaults
        .iter()
        .copied()
        .filter(|p| Path::new(p).exists())
        .collect();
    match running.as_slice() {
        [one] => Ok(PathBuf::from(one)),
        [] => bail!(
            "no fqdnd admin socket at {} or {}: is `fqdnd gateway` or `fqdnd node` running? \
             (--admin-socket, FQDND_ADMIN_SOCKET or --config say where else)",
            defaults[0],
            defaults[1]
        ),
        _ => bail!(
            "both {} and {} exist: say which daemon with --admin-socket (or --config)",
            defaults[0],
            defaults[1]
        ),
    }
}

/// One request; returns the body of a 2xx answer, or the answer as the error ([`crate::Error::Answered`]).
pub fn request(socket: &Path, method: Method, path: &str, body: &str) -> Result<String> {
    send(socket, method, path, body, None)
}

fn send(
    socket: &Path,
    method: Method,
    path: &str,
    body: &str,
    content_type: Option<&'static str>,
) -> Result<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the client's runtime")?;
    runtime.block_on(async {
        tokio::time::timeout(
            TIMEOUT,
            exchange(socket, method, path, body.to_owned(), content_type),
        )
        .await
        .map_err(|_| refused!("the admin API did not answer within {}s", TIMEOUT.as_secs()))?
    })
}

async fn exchange(
    socket: &Path,
    method: Method,
    path: &str,
    body: String,
    content_type: Option<&'static str>,
) -> Result<String> {
    let stream = UnixStream::connect(socket).await.with_context(|| {
        format!(
            "connecting to the admin socket {} (is fqdnd running? see --admin-socket)",
            socket.display()
        )
    })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("talking HTTP to the admin socket")?;
    let driver = tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "fqdnd");
    if let Some(content_type) = content_type {
        request = request.header(hyper::header::CONTENT_TYPE, content_type);
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .context("building the request")?;
    let response = sender
        .send_request(request)
        .await
        .context("sending the request")?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .context("reading the admin API's answer")?
        .to_bytes();
    driver.abort();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if !status.is_success() {
        return Err(crate::Error::Answered {
            status,
            body: text.trim().to_owned(),
        });
    }
    Ok(text)
}

/// `GET path`, decoded; also returns the raw JSON (for `--json`).
pub fn get<T: DeserializeOwned>(socket: &Path, path: &str) -> Result<(String, T)> {
    let body = request(socket, Method::GET, path, "")?;
    let parsed = serde_json::from_str(&body).with_context(|| format!("decoding {path}"))?;
    Ok((body, parsed))
}

/// `POST path` with `body`, decoded; also returns the raw JSON.
pub fn post<T: DeserializeOwned>(socket: &Path, path: &str, body: &str) -> Result<(String, T)> {
    let text = request(socket, Method::POST, path, body)?;
    let parsed = serde_json::from_str(&text).with_context(|| format!("decoding {path}"))?;
    Ok((text, parsed))
}

/// `POST path` with `body` as JSON, decoded; also returns the raw JSON.
pub fn post_json<T: DeserializeOwned>(
    socket: &Path,
    path: &str,
    body: &impl serde::Serialize,
) -> Result<(String, T)> {
    let body = serde_json::to_string(body).context("encoding the request")?;
    let text = send(socket, Method::POST, path, &body, Some("application/json"))?;
    let parsed = serde_json::from_str(&text).with_context(|| format!("decoding {path}"))?;
    Ok((text, parsed))
}

/// `DELETE path`.
pub fn delete(socket: &Path, path: &str) -> Result<()> {
    request(socket, Method::DELETE, path, "").map(|_| ())
}
