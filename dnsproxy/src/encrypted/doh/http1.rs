//! DoH over HTTP/1.1 (a client that did not offer `h2`): hyper's server, one request at a
//! time per connection.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::{Answer, Connection, MAX_HEADERS, MAX_MESSAGE, Wants, head};
use crate::encrypted::EncryptedError;
use crate::policy::Transport;

/// Serves HTTP/1.1 requests until the client goes, `idle` passes with nothing in flight (the
/// connection is then shut down gracefully), or an HTTP error ends it (counted).
pub(super) async fn serve(conn: Arc<Connection>, tls: TlsStream<TcpStream>, idle: Duration) {
    let state = conn.clone();
    let service = hyper::service::service_fn(move |request| {
        let conn = state.clone();
        async move { Ok::<_, Infallible>(respond(&conn, request).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .max_buf_size(MAX_HEADERS.max(8192))
        .keep_alive(true);
    let mut http = std::pin::pin!(builder.serve_connection(TokioIo::new(tls), service));
    let result = tokio::select! {
        result = http.as_mut() => result,
        () = conn.activity.idle_for(idle) => {
            http.as_mut().graceful_shutdown();
            tokio::time::timeout(idle, http).await.unwrap_or(Ok(()))
        }
    };
    if let Err(e) = result
        && !ordinary_end(&e)
    {
        conn.shared
            .metrics
            .encrypted_error(Transport::Doh, EncryptedError::Http);
        tracing::debug!(client = %conn.client, error = %e, "DoH connection ended by an HTTP error");
    }
}

/// One request's response.
async fn respond(conn: &Connection, request: Request<Incoming>) -> hyper::Response<Full<Bytes>> {
    let _busy = conn.activity.begin();
    let (parts, body) = request.into_parts();
    let answer = match conn.admit(
        &parts.method,
        &parts.uri,
        parts.headers.get(hyper::header::CONTENT_TYPE),
    ) {
        Ok(Wants::Query(query)) => conn.resolve(query).await,
        Ok(Wants::Body) => match Limited::new(body, MAX_MESSAGE).collect().await {
            Ok(body) => conn.resolve(body.to_bytes().to_vec()).await,
            Err(e) if e.is::<http_body_util::LengthLimitError>() => conn.refuse(
                hyper::StatusCode::PAYLOAD_TOO_LARGE,
                EncryptedError::TooLarge,
            ),
            Err(_) => conn.refuse(hyper::StatusCode::BAD_REQUEST, EncryptedError::BadRequest),
        },
        Err(answer) => answer,
    };
    let (parts, ()) = head(conn, &answer).into_parts();
    let body = match answer {
        Answer::Dns { message, .. } => Bytes::from(message),
        Answer::Status(_) => Bytes::new(),
    };
    hyper::Response::from_parts(parts, Full::new(body))
}

/// Whether a connection's error is only the client going away.
fn ordinary_end(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return super::client_went(io);
        }
        source = cause.source();
    }
    false
}
