//! DNS over HTTPS (RFC 8484) on one TLS connection: HTTP/2 or HTTP/1.1 by ALPN, GET
//! (`?dns=` base64url) and POST (`application/dns-message`), one DNS message per request.
//!
//! Limits: `max_streams` concurrent HTTP/2 streams, 16 KiB of headers, a 65,535-byte body
//! (413 past it), HTTP/2 streams reset by the client before an answer at most
//! [`MAX_PENDING_RESETS`] pending at once and [`MAX_ERROR_RESETS`] protocol resets in all
//! (the rapid-reset attack, CVE-2023-44487: h2 then sends GOAWAY and the connection ends), and
//! the idle timeout: with no request in flight for `idle_timeout`, the connection is shut down
//! gracefully (GOAWAY for HTTP/2).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

use super::{EncryptedConfig, EncryptedError};
use crate::policy::Transport;
use crate::proxy::{Handled, Shared, Worker};
use crate::upstream::{ReplyTo, TcpOut, TcpReply};
use crate::wire;

/// The media type of a DNS message (RFC 8484 §6).
const DNS_MESSAGE: &str = "application/dns-message";
/// The largest DNS message, and so the largest body.
const MAX_MESSAGE: usize = 65_535;
/// Header bytes a request may carry (HTTP/2 header list, HTTP/1.1 read buffer).
const MAX_HEADERS: usize = 16 * 1024;
/// HTTP/2 streams reset by the client and not yet accepted, at most (h2's own default,
/// written down: the bound on the rapid-reset pattern).
const MAX_PENDING_RESETS: usize = 20;
/// HTTP/2 streams the server reset for protocol errors, at most, before GOAWAY.
const MAX_ERROR_RESETS: usize = 1024;
/// Idle per-connection workers kept for the next requests (a worker's buffers are reused, not
/// made again per request).
const SPARE_WORKERS: usize = 128;

/// Serves DoH on an established TLS connection until the client goes, the idle timeout
/// passes with nothing in flight, or an HTTP error ends it (counted).
pub(super) async fn serve(
    shared: &Arc<Shared>,
    tls: TlsStream<TcpStream>,
    client: SocketAddr,
    server: SocketAddr,
    config: &EncryptedConfig,
) {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    let activity = Arc::new(Activity::new());
    let state = Arc::new(Connection {
        shared: shared.clone(),
        client,
        server,
        path: config.doh_path.clone(),
        activity: activity.clone(),
        spare: Mutex::new(Vec::new()),
    });
    let service = hyper::service::service_fn(move |request| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(state.handle(request).await) }
    });
    let io = TokioIo::new(tls);
    let idle = config.idle_timeout;
    let result = if h2 {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(config.max_streams)
            .max_header_list_size(u32::try_from(MAX_HEADERS).unwrap_or(u32::MAX))
            .max_pending_accept_reset_streams(MAX_PENDING_RESETS)
            .max_local_error_reset_streams(MAX_ERROR_RESETS);
        let conn = std::pin::pin!(builder.serve_connection(io, service));
        drive(conn, |c| c.graceful_shutdown(), &activity, idle).await
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .max_buf_size(MAX_HEADERS.max(8192))
            .keep_alive(true);
        let conn = std::pin::pin!(builder.serve_connection(io, service));
        drive(conn, |c| c.graceful_shutdown(), &activity, idle).await
    };
    if let Err(e) = result
        && !ordinary_end(&e)
    {
        shared
            .metrics
            .encrypted_error(Transport::Doh, EncryptedError::Http);
        tracing::debug!(%client, error = %e, "DoH connection ended by an HTTP error");
    }
}

/// Runs the connection; once it has been idle for `idle` with no request in flight, shuts it
/// down gracefully and lets it finish (at most `idle` more).
async fn drive<C>(
    mut conn: Pin<&mut C>,
    shutdown: impl FnOnce(Pin<&mut C>),
    activity: &Activity,
    idle: Duration,
) -> Result<(), hyper::Error>
where
    C: Future<Output = Result<(), hyper::Error>>,
{
    tokio::select! {
        result = conn.as_mut() => return result,
        () = activity.idle_for(idle) => shutdown(conn.as_mut()),
    }
    tokio::time::timeout(idle, conn).await.unwrap_or(Ok(()))
}

/// Whether a connection's error is only the client going away.
fn ordinary_end(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::NotConnected
            );
        }
        source = cause.source();
    }
    false
}

/// When the connection last finished a request, and how many are in flight.
struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

/// A request in flight; ends it when dropped.
struct Busy<'a>(&'a Activity);

impl Activity {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn begin(&self) -> Busy<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(self)
    }

    fn last(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Resolves once nothing has been in flight for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            tokio::time::sleep_until(self.last() + idle).await;
            if self.in_flight.load(Ordering::Relaxed) == 0 && self.last() + idle <= Instant::now() {
                return;
            }
            if self.in_flight.load(Ordering::Relaxed) > 0 {
                // Busy: look again one idle period from now.
                tokio::time::sleep(idle).await;
            }
        }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_ms.store(ms, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every request of one connection shares.
struct Connection {
    shared: Arc<Shared>,
    client: SocketAddr,
    server: SocketAddr,
    path: String,
    activity: Arc<Activity>,
    /// Workers of finished requests, for the next ones.
    spare: Mutex<Vec<Worker>>,
}

impl Connection {
    /// Answers one request: the DNS message it carries goes through the proxy as any query.
    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let _busy = self.activity.begin();
        let mut query = match self.query_of(request).await {
            Ok(query) => query,
            Err((status, reason)) => {
                self.shared.metrics.encrypted_error(Transport::Doh, reason);
                return plain(status);
            }
        };
        let mut worker = self
            .spare
            .lock()
            .ok()
            .and_then(|mut spare| spare.pop())
            .unwrap_or_else(|| Worker::new(0));
        let (tx, mut rx) = mpsc::unbounded_channel::<TcpOut>();
        let handled = self
            .shared
            .handle_query(
                &mut worker,
                &mut query,
                self.client,
                self.server,
                Transport::Doh,
                || ReplyTo::Tcp(TcpReply::new(tx.clone())),
            )
            .await;
        drop(tx);
        let reply = match handled {
            Handled::Reply => Some(std::mem::take(&mut worker.scratch)),
            Handled::Forwarded => rx.recv().await.flatten(),
            Handled::Dropped => None,
            Handled::Runt => {
                self.shared
                    .metrics
                    .encrypted_error(Transport::Doh, EncryptedError::BadRequest);
                return plain(StatusCode::BAD_REQUEST);
            }
        };
        let response = match reply {
            Some(reply) => {
                let max_age = wire::min_ttl(&reply).unwrap_or(0);
                dns_message(reply, max_age)
            }
            // Dropped (rate limit) or no answer in time (`onUpstreamTimeout: noReply`).
            None => plain(StatusCode::SERVICE_UNAVAILABLE),
        };
        if let Ok(mut spare) = self.spare.lock()
            && spare.len() < SPARE_WORKERS
        {
            spare.push(worker);
        }
        response
    }

    /// The DNS query a request carries, or the status that refuses it.
    async fn query_of(
        &self,
        request: Request<Incoming>,
    ) -> Result<Vec<u8>, (StatusCode, EncryptedError)> {
        let bad = |status| (status, EncryptedError::BadRequest);
        if request.uri().path() != self.path {
            return Err(bad(StatusCode::NOT_FOUND));
        }
        match *request.method() {
            Method::GET => request
                .uri()
                .query()
                .and_then(dns_parameter)
                .ok_or(bad(StatusCode::BAD_REQUEST)),
            Method::POST => {
                let media = request
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| v.split(';').next().unwrap_or("").trim());
                if media.is_none_or(|m| !m.eq_ignore_ascii_case(DNS_MESSAGE)) {
                    return Err(bad(StatusCode::UNSUPPORTED_MEDIA_TYPE));
                }
                match Limited::new(request.into_body(), MAX_MESSAGE)
                    .collect()
                    .await
                {
                    Ok(body) => Ok(body.to_bytes().to_vec()),
                    Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                        Err((StatusCode::PAYLOAD_TOO_LARGE, EncryptedError::TooLarge))
                    }
                    Err(_) => Err(bad(StatusCode::BAD_REQUEST)),
                }
            }
            _ => Err(bad(StatusCode::METHOD_NOT_ALLOWED)),
        }
    }
}

/// The `dns` parameter of a GET query string, decoded (base64url; padding tolerated).
fn dns_parameter(query: &str) -> Option<Vec<u8>> {
    const BASE64URL: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let value = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("dns="))?;
    if value.len() > MAX_MESSAGE.div_ceil(3) * 4 {
        return None;
    }
    BASE64URL.decode(value).ok()
}

/// A 200 carrying a DNS message, fresh for `max_age` seconds (the smallest TTL of its
/// records, RFC 8484 §5.1).
fn dns_message(reply: Vec<u8>, max_age: u32) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(reply)));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(DNS_MESSAGE));
    if let Ok(value) = HeaderValue::from_str(&format!("max-age={max_age}")) {
        headers.insert(header::CACHE_CONTROL, value);
    }
    response
}

/// An empty response with `status` (405 says what is allowed).
fn plain(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    if status == StatusCode::METHOD_NOT_ALLOWED {
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dns_parameter_is_base64url_with_or_without_padding() {
        // RFC 8484 §4.1.1's example: www.example.com A, ID 0.
        let q = "dns=AAABAAABAAAAAAAAA3d3dwdleGFtcGxlA2NvbQAAAQAB";
        let decoded = dns_parameter(q).unwrap();
        assert_eq!(decoded.len(), 33);
        assert_eq!(&decoded[12..16], b"\x03www");
        assert_eq!(dns_parameter(&format!("ct=x&{q}")), Some(decoded.clone()));
        assert_eq!(dns_parameter("dns=AAAB+/8="), None, "not the URL alphabet");
        assert_eq!(dns_parameter("nodns=AAAB"), None);
        assert!(dns_parameter("dns=AAABAA==").is_some(), "padding tolerated");
    }
}
