//! DNS over HTTPS to one upstream (RFC 8484): one HTTP/2 connection (ALPN `h2`), each query a
//! POST of `application/dns-message` on a stream of its own, so queries run concurrently and
//! are answered in any order; the answer is matched by ID in the upstream's in-flight table
//! as a UDP answer is.
//!
//! The connection is opened by the first query and kept; when it ends (an error, the server's
//! GOAWAY) the next query opens a new one. A request the connection had not sent when it
//! closed is sent once more on the next one; any other failure (a refused connection, a
//! status other than 200, a body that is not a DNS message) loses the query, which then times
//! out like an unanswered UDP query.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::{self, SendRequest};
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::upstream_encrypted::{Query, Transport, UpstreamAddr, UpstreamProtocol};

/// The media type of a DNS message (RFC 8484 §6).
const DNS_MESSAGE: &str = "application/dns-message";

/// The largest DNS message: a bigger body is not an answer.
const MAX_ANSWER: usize = 65_535;

/// Runs the upstream's connection until the proxy stops.
pub(crate) async fn run(mut t: Transport, answers: mpsc::Sender<Vec<u8>>) {
    let uri = match uri(&t.upstream) {
        Ok(uri) => uri,
        Err(error) => {
            // Checked at bind; never expected here.
            t.report.failed(error);
            return;
        }
    };
    // The connection and the requests in flight: aborted with this task when the proxy stops.
    let mut tasks = JoinSet::new();
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    while let Some(query) = t.queries.recv().await {
        while tasks.try_join_next().is_some() {}
        if sender.as_ref().is_none_or(SendRequest::is_closed) {
            sender = None;
            match tokio::time::timeout(t.timeout, connect(&t, &mut tasks)).await {
                Ok(Ok(connected)) => {
                    t.report.connected();
                    sender = Some(connected);
                }
                Ok(Err(error)) => {
                    t.report.failed(error);
                    t.drop_waiting();
                    continue;
                }
                Err(_) => {
                    t.report
                        .failed(format!("no connection within {:?}", t.timeout));
                    t.drop_waiting();
                    continue;
                }
            }
        }
        let Some(sender) = &mut sender else {
            continue;
        };
        let request = match request(&uri, query.bytes) {
            Ok(request) => request,
            Err(e) => {
                tracing::debug!(upstream = %t.report.label(), error = %e, "DoH request not built");
                continue;
            }
        };
        let exchange = sender.try_send_request(request);
        let answers = answers.clone();
        let requeue = t.requeue.clone();
        let label = t.report.label().to_owned();
        let timeout = t.timeout;
        let retried = query.retried;
        tasks.spawn(async move {
            let result = match tokio::time::timeout(timeout, exchange).await {
                Err(_) => return,
                Ok(Ok(response)) => answer(response).await,
                Ok(Err(mut e)) => {
                    // Not sent before the connection closed: once more on the next one.
                    if let Some(request) = e.take_message()
                        && !retried
                    {
                        let Ok(body) = request.into_body().collect().await;
                        let _ = requeue.send(Query {
                            bytes: body.to_bytes().to_vec(),
                            retried: true,
                        });
                        return;
                    }
                    Err(e.into_error().to_string())
                }
            };
            match result {
                Ok(bytes) => {
                    let _ = answers.send(bytes).await;
                }
                Err(error) => {
                    tracing::debug!(upstream = %label, %error, "DoH exchange failed; the query will time out");
                }
            }
        });
    }
}

/// Opens the TLS connection and the HTTP/2 session on it; its driver joins `tasks`.
async fn connect(
    t: &Transport,
    tasks: &mut JoinSet<()>,
) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = t.connector.connect().await?;
    if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
        return Err("the server does not speak HTTP/2 (ALPN h2)".to_owned());
    }
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
    let label = t.report.label().to_owned();
    tasks.spawn(async move {
        let reason = match connection.await {
            Ok(()) => "closed".to_owned(),
            Err(e) => e.to_string(),
        };
        tracing::debug!(upstream = %label, %reason, "encrypted DNS upstream connection closed");
    });
    Ok(sender)
}

/// The answer in a response: status 200, a DNS message as the body.
async fn answer(response: hyper::Response<hyper::body::Incoming>) -> Result<Vec<u8>, String> {
    let status = response.status();
    if status != StatusCode::OK {
        return Err(format!("HTTP status {status}"));
    }
    let media = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !media.eq_ignore_ascii_case(DNS_MESSAGE) {
        return Err(format!("content type {media:?}, not {DNS_MESSAGE}"));
    }
    let body = Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    Ok(body.to_bytes().to_vec())
}

/// `POST` of the query to `uri`.
fn request(uri: &Uri, query: Vec<u8>) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
    Request::builder()
        .method(Method::POST)
        .uri(uri.clone())
        .header(CONTENT_TYPE, DNS_MESSAGE)
        .header(ACCEPT, DNS_MESSAGE)
        .body(Full::new(Bytes::from(query)))
}

/// `https://AUTHORITY/PATH`: the server name (or the IP address) and the port unless 443.
fn uri(upstream: &UpstreamAddr) -> Result<Uri, String> {
    let UpstreamProtocol::Https { server_name, path } = &upstream.protocol else {
        return Err("not a DoH upstream".to_owned());
    };
    let host = match (server_name, upstream.addr.ip()) {
        (Some(name), _) => name.clone(),
        (None, std::net::IpAddr::V4(ip)) => ip.to_string(),
        (None, std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
    };
    let port = upstream.addr.port();
    let authority = if port == 443 {
        host
    } else {
        format!("{host}:{port}")
    };
    format!("https://{authority}{path}")
        .parse()
        .map_err(|e| format!("{upstream}: not a URL: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doh(addr: &str, name: Option<&str>, path: &str) -> UpstreamAddr {
        UpstreamAddr {
            addr: addr.parse().unwrap(),
            protocol: UpstreamProtocol::Https {
                server_name: name.map(str::to_owned),
                path: path.to_owned(),
            },
        }
    }

    #[test]
    fn the_url_names_the_server_and_the_port_unless_443() {
        let cases = [
            (
                doh("192.0.2.1:443", Some("dns.example"), "/dns-query"),
                "https://dns.example/dns-query",
            ),
            (
                doh("192.0.2.1:8443", None, "/q"),
                "https://192.0.2.1:8443/q",
            ),
            (
                doh("[2001:db8::1]:443", None, "/"),
                "https://[2001:db8::1]/",
            ),
        ];
        for (upstream, expected) in cases {
            assert_eq!(uri(&upstream).unwrap().to_string(), expected);
        }
        let dot = UpstreamAddr {
            addr: "192.0.2.1:853".parse().unwrap(),
            protocol: UpstreamProtocol::Tls { server_name: None },
        };
        assert!(uri(&dot).is_err());
    }

    #[test]
    fn a_query_is_a_post_of_a_dns_message() {
        let uri: Uri = "https://dns.example/dns-query".parse().unwrap();
        let request = request(&uri, vec![1, 2, 3]).unwrap();
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.headers()[CONTENT_TYPE], DNS_MESSAGE);
        assert_eq!(request.headers()[ACCEPT], DNS_MESSAGE);
        assert_eq!(request.uri(), &uri);
    }
}
