//! DNS over HTTPS (RFC 8484) on one TLS connection: HTTP/2 or HTTP/1.1 by ALPN, GET
//! (`?dns=` base64url) and POST (`application/dns-message`), one DNS message per request.
//! HTTP/2 is served with the h2 crate directly ([`h2`]): every stream of a connection is
//! answered in the connection's own task, no task spawned per request; HTTP/1.1 with hyper
//! ([`http1`]). Both go through [`Connection`]: what a request asks, and its answer.
//!
//! Limits: `max_streams` concurrent HTTP/2 streams, 16 KiB of headers, a 65,535-byte body
//! (413 past it), HTTP/2 streams reset by the client before an answer at most
//! [`MAX_PENDING_RESETS`] pending at once and [`MAX_ERROR_RESETS`] protocol resets in all
//! (the rapid-reset attack, CVE-2023-44487: h2 then sends GOAWAY and the connection ends), and
//! the idle timeout: with no request in flight for `idle_timeout`, the connection is shut down
//! gracefully (GOAWAY for HTTP/2).

mod h2;
mod http1;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Response, StatusCode};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

use super::{EncryptedConfig, EncryptedError};
use crate::policy::Transport;
use crate::proxy::{Handled, Shared, Worker};
use crate::upstream::{ReplyTo, TcpReply};
use crate::wire;

/// The media type of a DNS message (RFC 8484 §6).
const DNS_MESSAGE: &str = "application/dns-message";
/// The largest DNS message, and so the largest body.
pub(super) const MAX_MESSAGE: usize = 65_535;
/// Header bytes a request may carry (HTTP/2 header list, HTTP/1.1 read buffer).
pub(super) const MAX_HEADERS: usize = 16 * 1024;
/// HTTP/2 streams reset by the client and not yet accepted, at most (h2's own default,
/// written down: the bound on the rapid-reset pattern).
pub(super) const MAX_PENDING_RESETS: usize = 20;
/// HTTP/2 streams the server reset for protocol errors, at most, before GOAWAY.
pub(super) const MAX_ERROR_RESETS: usize = 1024;
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
    let conn = Arc::new(Connection {
        shared: shared.clone(),
        client,
        server,
        path: config.doh_path.clone(),
        activity: Activity::new(),
        spare: Mutex::new(Vec::new()),
        cache_control: Mutex::new(None),
    });
    if h2 {
        h2::serve(conn, tls, config).await;
    } else {
        http1::serve(conn, tls, config.idle_timeout).await;
    }
}

/// Whether an I/O error is only the client going away.
fn client_went(io: &std::io::Error) -> bool {
    matches!(
        io.kind(),
        std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::NotConnected
    )
}

/// When the connection last finished a request, and how many are in flight.
pub(super) struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

/// A request in flight; ends it when dropped.
pub(super) struct Busy<'a>(&'a Activity);

impl Activity {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    pub(super) fn begin(&self) -> Busy<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(self)
    }

    fn last(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Resolves once nothing has been in flight for `idle`.
    pub(super) async fn idle_for(&self, idle: Duration) {
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
pub(super) struct Connection {
    shared: Arc<Shared>,
    client: SocketAddr,
    server: SocketAddr,
    path: String,
    pub(super) activity: Activity,
    /// Workers of finished requests, for the next ones (boxed: a request's future holds one
    /// across its awaits, and moves it whenever the future moves).
    #[allow(
        clippy::vec_box,
        reason = "the box moves between this list and a request's future"
    )]
    spare: Mutex<Vec<Box<Worker>>>,
    /// The last `Cache-Control` value made, by its max-age.
    cache_control: Mutex<Option<(u32, HeaderValue)>>,
}

/// What a request asks, once its head is read.
pub(super) enum Wants {
    /// A GET: the query is in the URI.
    Query(Vec<u8>),
    /// A POST of a DNS message: the query is the body.
    Body,
}

/// What a request gets.
pub(super) enum Answer {
    /// 200 with a DNS message, fresh for `max_age` seconds.
    Dns { message: Vec<u8>, max_age: u32 },
    /// An error status, no body.
    Status(StatusCode),
}

impl Connection {
    /// Checks a request's head: the path, the method, the media type of a POST.
    pub(super) fn admit(
        &self,
        method: &Method,
        uri: &hyper::Uri,
        media: Option<&HeaderValue>,
    ) -> Result<Wants, Answer> {
        if uri.path() != self.path {
            return Err(self.refuse(StatusCode::NOT_FOUND, EncryptedError::BadRequest));
        }
        match *method {
            Method::GET => match uri.query().and_then(dns_parameter) {
                Some(query) => Ok(Wants::Query(query)),
                None => Err(self.refuse(StatusCode::BAD_REQUEST, EncryptedError::BadRequest)),
            },
            Method::POST => {
                let media = media
                    .and_then(|v| v.to_str().ok())
                    .map(|v| v.split(';').next().unwrap_or("").trim());
                if media.is_some_and(|m| m.eq_ignore_ascii_case(DNS_MESSAGE)) {
                    Ok(Wants::Body)
                } else {
                    Err(self.refuse(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        EncryptedError::BadRequest,
                    ))
                }
            }
            _ => Err(self.refuse(StatusCode::METHOD_NOT_ALLOWED, EncryptedError::BadRequest)),
        }
    }

    /// `Cache-Control: max-age=N`: the last one made is kept (a cheap clone), as the answers
    /// of one connection often have the same TTL.
    fn cache_control(&self, max_age: u32) -> Option<HeaderValue> {
        let mut last = self.cache_control.lock().ok()?;
        match &*last {
            Some((age, value)) if *age == max_age => Some(value.clone()),
            _ => {
                let value = HeaderValue::from_str(&format!("max-age={max_age}")).ok()?;
                *last = Some((max_age, value.clone()));
                Some(value)
            }
        }
    }

    /// Counts a refused request; its answer.
    pub(super) fn refuse(&self, status: StatusCode, reason: EncryptedError) -> Answer {
        self.shared.metrics.encrypted_error(Transport::Doh, reason);
        Answer::Status(status)
    }

    /// Answers one query: it goes through the proxy as any query does.
    pub(super) async fn resolve(&self, mut query: Vec<u8>) -> Answer {
        let mut worker = self
            .spare
            .lock()
            .ok()
            .and_then(|mut spare| spare.pop())
            .unwrap_or_else(|| Box::new(Worker::new(0)));
        // One reply at most: a oneshot, not a connection's queue.
        let (tx, rx) = oneshot::channel();
        let handled = self
            .shared
            .handle_query(
                &mut worker,
                &mut query,
                self.client,
                self.server,
                Transport::Doh,
                || ReplyTo::Tcp(TcpReply::request(tx)),
            )
            .await;
        let reply = match handled {
            Handled::Reply => Some(std::mem::take(&mut worker.scratch)),
            Handled::Forwarded => rx.await.ok(),
            Handled::Dropped => None,
            Handled::Runt => None,
        };
        if let Ok(mut spare) = self.spare.lock()
            && spare.len() < SPARE_WORKERS
        {
            spare.push(worker);
        }
        match (handled, reply) {
            (Handled::Runt, _) => self.refuse(StatusCode::BAD_REQUEST, EncryptedError::BadRequest),
            (_, Some(message)) => Answer::Dns {
                max_age: wire::min_ttl(&message).unwrap_or(0),
                message,
            },
            // Dropped (rate limit) or no answer in time (`onUpstreamTimeout: noReply`).
            (_, None) => Answer::Status(StatusCode::SERVICE_UNAVAILABLE),
        }
    }
}

/// The head of a response to `answer` (its body is the message, if any).
pub(super) fn head(conn: &Connection, answer: &Answer) -> Response<()> {
    let mut response = Response::new(());
    let headers = response.headers_mut();
    match answer {
        Answer::Dns { max_age, .. } => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(DNS_MESSAGE));
            if let Some(value) = conn.cache_control(*max_age) {
                headers.insert(header::CACHE_CONTROL, value);
            }
        }
        Answer::Status(status) => {
            if *status == StatusCode::METHOD_NOT_ALLOWED {
                headers.insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
            }
            *response.status_mut() = *status;
        }
    }
    response
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
