//! DoH over HTTP/2 with the h2 crate: the connection's task accepts streams and answers each
//! in a set of futures it polls itself — no task per request, no service layer. h2 enforces
//! the stream limits and the rapid-reset bound (GOAWAY `ENHANCE_YOUR_CALM`).

use std::sync::Arc;

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::stream::{FuturesUnordered, StreamExt};
use hyper::StatusCode;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::{
    Answer, Connection, MAX_ERROR_RESETS, MAX_HEADERS, MAX_MESSAGE, MAX_PENDING_RESETS, Wants, head,
};
use crate::encrypted::{EncryptedConfig, EncryptedError};
use crate::policy::Transport;

/// Streams answered at most per turn before the connection writes.
const BATCH: usize = 64;

/// Serves HTTP/2 streams until the client goes, the idle timeout passes with nothing in flight
/// (GOAWAY, then the streams in flight finish), or a protocol error ends it (counted).
pub(super) async fn serve(
    conn: Arc<Connection>,
    tls: TlsStream<TcpStream>,
    config: &EncryptedConfig,
) {
    let mut builder = ::h2::server::Builder::new();
    builder
        .max_concurrent_streams(config.max_streams)
        .max_header_list_size(u32::try_from(MAX_HEADERS).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(MAX_PENDING_RESETS)
        .max_local_error_reset_streams(Some(MAX_ERROR_RESETS));
    let mut http = match builder.handshake::<_, Bytes>(tls).await {
        Ok(http) => http,
        Err(e) => return ended(&conn, &e),
    };
    let mut streams = FuturesUnordered::new();
    let mut closing = false;
    let idle = config.idle_timeout;
    loop {
        tokio::select! {
            accepted = http.accept() => match accepted {
                Some(Ok((request, respond))) => streams.push(stream(&conn, request, respond)),
                Some(Err(e)) => return ended(&conn, &e),
                None => break,
            },
            Some(()) = streams.next(), if !streams.is_empty() => {
                // Every other stream already answered too, before h2 writes: their responses
                // leave together (one TLS record and one write, not one per response).
                for _ in 0..BATCH {
                    if streams.next().now_or_never().flatten().is_none() {
                        break;
                    }
                }
            }
            () = conn.activity.idle_for(idle), if !closing => {
                closing = true;
                http.graceful_shutdown();
            }
        }
    }
    // The client is gone or the connection closing: finish what is in flight, bounded.
    let _ = tokio::time::timeout(idle, async { while streams.next().await.is_some() {} }).await;
}

/// Counts a connection ended by a protocol error (not by the client simply going).
fn ended(conn: &Connection, e: &::h2::Error) {
    if e.is_io() && e.get_io().is_some_and(super::client_went) {
        return;
    }
    if e.is_go_away() && e.is_remote() {
        return;
    }
    conn.shared
        .metrics
        .encrypted_error(Transport::Doh, EncryptedError::Http);
    tracing::debug!(client = %conn.client, error = %e, "DoH connection ended by an HTTP/2 error");
}

/// One stream: its request answered.
async fn stream(
    conn: &Connection,
    request: hyper::Request<::h2::RecvStream>,
    mut respond: ::h2::server::SendResponse<Bytes>,
) {
    let _busy = conn.activity.begin();
    let (parts, mut body) = request.into_parts();
    let answer = match conn.admit(
        &parts.method,
        &parts.uri,
        parts.headers.get(hyper::header::CONTENT_TYPE),
    ) {
        Ok(Wants::Query(query)) => conn.resolve(query).await,
        Ok(Wants::Body) => match read_body(&mut body).await {
            Ok(query) => conn.resolve(query).await,
            Err(answer) => answer(conn),
        },
        Err(answer) => answer,
    };
    let head = head(conn, &answer);
    match answer {
        Answer::Dns { message, .. } => {
            if let Ok(mut send) = respond.send_response(head, false) {
                let _ = send.send_data(Bytes::from(message), true);
            }
        }
        Answer::Status(_) => {
            let _ = respond.send_response(head, true);
        }
    }
}

/// A POST body, at most one DNS message long; the connection's flow-control window is given
/// back as it is read.
async fn read_body(body: &mut ::h2::RecvStream) -> Result<Vec<u8>, fn(&Connection) -> Answer> {
    let mut query = Vec::new();
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else {
            return Err(|conn| conn.refuse(StatusCode::BAD_REQUEST, EncryptedError::BadRequest));
        };
        let _ = body.flow_control().release_capacity(chunk.len());
        if query.len() + chunk.len() > MAX_MESSAGE {
            return Err(|conn| {
                conn.refuse(StatusCode::PAYLOAD_TOO_LARGE, EncryptedError::TooLarge)
            });
        }
        query.extend_from_slice(&chunk);
    }
    Ok(query)
}
