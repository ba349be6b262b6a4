//! DoT and DoH clients: the same verdicts and holds as UDP, the transport said in the log and
//! the metrics, HTTP/2 and HTTP/1.1, the request errors, and hostile clients kept bounded
//! (connection limits, handshake timeout, garbage, the HTTP/2 rapid-reset pattern) while others
//! are served. Real clocks: TLS and HTTP need the runtime's I/O; every wait has a deadline.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fqdnd_dnsproxy::{Config, EncryptedConfig, EncryptedError, TlsCertificates, Transport};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::harness::{Harness, Mode, eventually, ips, patiently, query, within};
use crate::upstream::answer;

/// A self-signed certificate for `dns.test`: the server's pair, and the client's trust in it.
struct TestCert {
    key: rustls::sign::CertifiedKey,
    der: CertificateDer<'static>,
}

fn test_cert() -> TestCert {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["dns.test".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let der = cert.der().clone();
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signing = rustls::crypto::ring::sign::any_supported_type(&private).unwrap();
    TestCert {
        key: rustls::sign::CertifiedKey::new(vec![der.clone()], signing),
        der,
    }
}

/// A proxy with DoT and DoH listeners on loopback, `tweak`ed.
async fn encrypted_proxy(tweak: impl FnOnce(&mut EncryptedConfig)) -> (Harness, TestCert) {
    let (h, cert, _) = encrypted_proxy_with(tweak).await;
    (h, cert)
}

/// The same, with the handle that replaces its certificate.
async fn encrypted_proxy_with(
    tweak: impl FnOnce(&mut EncryptedConfig),
) -> (Harness, TestCert, Arc<TlsCertificates>) {
    let cert = test_cert();
    let certificates = TlsCertificates::new(cert.key.clone());
    let mut encrypted = EncryptedConfig::new(certificates.clone());
    encrypted.listen_dot = vec!["127.0.0.1:0".parse().unwrap()];
    encrypted.listen_doh = vec!["127.0.0.1:0".parse().unwrap()];
    tweak(&mut encrypted);
    let h = Harness::start(Mode::Done, |c: &mut Config| c.encrypted = Some(encrypted)).await;
    h.upstream.rule(
        "www.example.",
        answer("www.example.", [Ipv4Addr::new(192, 0, 2, 80)]),
    );
    (h, cert, certificates)
}

/// A TLS connection to `server` trusting `cert`, offering `alpn`.
async fn tls(server: SocketAddr, cert: &TestCert, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = patiently(TcpStream::connect(server)).await.unwrap();
    let name = ServerName::try_from("dns.test").unwrap();
    patiently(connector.connect(name, tcp)).await.unwrap()
}

/// Sends framed `messages` over a DoT stream.
async fn dot_send(stream: &mut TlsStream<TcpStream>, messages: &[&[u8]]) {
    let mut out = Vec::new();
    for m in messages {
        out.extend_from_slice(&u16::try_from(m.len()).unwrap().to_be_bytes());
        out.extend_from_slice(m);
    }
    stream.write_all(&out).await.unwrap();
    stream.flush().await.unwrap();
}

/// The next framed message on a DoT stream (`None`: closed).
async fn dot_recv(stream: &mut TlsStream<TcpStream>) -> Option<Vec<u8>> {
    patiently(async {
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.ok()?;
        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut msg).await.ok()?;
        Some(msg)
    })
    .await
}

#[tokio::test]
async fn dot_queries_meet_the_policy_and_the_hold_and_say_their_transport() {
    let (h, cert) = encrypted_proxy(|_| {}).await;
    let mut stream = tls(h.dot.unwrap(), &cert, &[b"dot"]).await;
    let allowed = query("www.example.", RecordType::A, None);
    let denied = query("denied.example.", RecordType::A, None);
    dot_send(&mut stream, &[&allowed, &denied]).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let reply = Message::from_vec(&dot_recv(&mut stream).await.unwrap()).unwrap();
        seen.push((reply.queries[0].name.to_ascii(), reply));
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(seen[0].0, "denied.example.");
    assert_eq!(seen[0].1.metadata.response_code, ResponseCode::Refused);
    assert_eq!(ips(&seen[1].1), [Ipv4Addr::new(192, 0, 2, 80)].into());
    // The observer saw the answer before the client got it, told it came by DoT.
    let observed = h.observer.seen_name("www.example.");
    assert_eq!(observed.len(), 1);
    let stats = h.settled().await;
    assert_eq!(stats.transport(Transport::Dot), 2);
    assert!(
        h.log
            .entries
            .lock()
            .unwrap()
            .iter()
            .all(|e| e.transport == Transport::Dot),
        "the query log names the transport"
    );
    h.stop().await;
}

/// An HTTP/2 or HTTP/1.1 DoH request; (status, content type, cache-control, body).
async fn doh_request(
    server: SocketAddr,
    cert: &TestCert,
    h2: bool,
    request: hyper::Request<Full<Bytes>>,
) -> (u16, String, String, Vec<u8>) {
    let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
    let io = TokioIo::new(tls(server, cert, &[alpn]).await);
    let response = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        patiently(sender.send_request(request)).await.unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        patiently(sender.send_request(request)).await.unwrap()
    };
    let header = |name| {
        response
            .headers()
            .get(name)
            .map(|v: &hyper::header::HeaderValue| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (status, media, cache) = (
        response.status().as_u16(),
        header(hyper::header::CONTENT_TYPE),
        header(hyper::header::CACHE_CONTROL),
    );
    let body = patiently(response.into_body().collect())
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, media, cache, body)
}

fn post(path: &str, media: &str, body: Vec<u8>) -> hyper::Request<Full<Bytes>> {
    hyper::Request::post(format!("https://dns.test{path}"))
        .header(hyper::header::CONTENT_TYPE, media)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn get(path_and_query: &str) -> hyper::Request<Full<Bytes>> {
    hyper::Request::get(format!("https://dns.test{path_and_query}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn base64url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[tokio::test]
async fn doh_answers_post_over_http2_and_get_over_http1_and_refuses_what_is_not_dns() {
    let (h, cert) = encrypted_proxy(|_| {}).await;
    let doh = h.doh.unwrap();
    let allowed = query("www.example.", RecordType::A, None);
    let (status, media, cache, body) = doh_request(
        doh,
        &cert,
        true,
        post("/dns-query", "application/dns-message", allowed.clone()),
    )
    .await;
    assert_eq!((status, media.as_str()), (200, "application/dns-message"));
    assert!(cache.starts_with("max-age="), "{cache}");
    let reply = Message::from_vec(&body).unwrap();
    assert_eq!(
        reply.metadata.id,
        u16::from_be_bytes([allowed[0], allowed[1]])
    );
    assert_eq!(ips(&reply), [Ipv4Addr::new(192, 0, 2, 80)].into());

    let denied = query("denied.example.", RecordType::A, None);
    let (status, _, _, body) = doh_request(
        doh,
        &cert,
        false,
        get(&format!("/dns-query?dns={}", base64url(&denied))),
    )
    .await;
    assert_eq!(status, 200);
    let reply = Message::from_vec(&body).unwrap();
    assert_eq!(reply.metadata.response_code, ResponseCode::Refused);

    // What is not a DNS query gets a 4xx, counted.
    let cases = [
        (
            post("/other", "application/dns-message", allowed.clone()),
            404,
        ),
        (post("/dns-query", "text/plain", allowed.clone()), 415),
        (
            post("/dns-query", "application/dns-message", vec![0; 70_000]),
            413,
        ),
        (get("/dns-query?dns=!!"), 400),
        (
            post("/dns-query", "application/dns-message", vec![0; 5]),
            400,
        ),
        (
            hyper::Request::put("https://dns.test/dns-query")
                .body(Full::new(Bytes::new()))
                .unwrap(),
            405,
        ),
    ];
    for (request, expected) in cases {
        let (status, ..) = doh_request(doh, &cert, true, request).await;
        assert_eq!(status, expected);
    }
    let stats = h.settled().await;
    assert_eq!(stats.transport(Transport::Doh), 2);
    assert_eq!(
        stats.encrypted_errors(Transport::Doh, EncryptedError::BadRequest),
        5
    );
    assert_eq!(
        stats.encrypted_errors(Transport::Doh, EncryptedError::TooLarge),
        1
    );
    h.stop().await;
}

/// Reads until the server closes the connection (or `window` passes): whether it did.
async fn closed_within(stream: &mut TcpStream, window: Duration) -> bool {
    within(window, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_some()
}

#[tokio::test]
async fn hostile_clients_are_bounded_and_counted_while_others_are_served() {
    let (h, cert) = encrypted_proxy(|e| {
        e.max_connections_per_client = 2;
        e.handshake_timeout = Duration::from_millis(300);
    })
    .await;
    let dot = h.dot.unwrap();
    // Garbage instead of a TLS hello: the handshake fails and the connection closes.
    let mut garbage = TcpStream::connect(dot).await.unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut garbage, Duration::from_secs(10)).await);
    // A silent client: closed once the handshake timeout passes.
    let mut silent = TcpStream::connect(dot).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(10)).await);
    // Two connections per client address: a third is closed at once.
    let mut first = tls(dot, &cert, &[b"dot"]).await;
    let _second = tls(dot, &cert, &[b"dot"]).await;
    let mut third = TcpStream::connect(dot).await.unwrap();
    assert!(closed_within(&mut third, Duration::from_secs(10)).await);
    // The clients within bounds are served all along.
    let q = query("www.example.", RecordType::A, None);
    dot_send(&mut first, &[&q]).await;
    let reply = Message::from_vec(&dot_recv(&mut first).await.unwrap()).unwrap();
    assert_eq!(ips(&reply), [Ipv4Addr::new(192, 0, 2, 80)].into());
    let stats = h.stats();
    assert_eq!(
        stats.encrypted_errors(Transport::Dot, EncryptedError::HandshakeFailed),
        1
    );
    assert_eq!(
        stats.encrypted_errors(Transport::Dot, EncryptedError::HandshakeTimeout),
        1
    );
    assert_eq!(
        stats.encrypted_errors(Transport::Dot, EncryptedError::MaxConnectionsPerClient),
        1
    );
    h.stop().await;
}

/// One HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// CVE-2023-44487: a client opens streams and resets each at once, in one burst. The server
/// ends the connection (GOAWAY ENHANCE_YOUR_CALM), counts it, and serves everyone else.
#[tokio::test]
async fn the_http2_rapid_reset_pattern_ends_the_connection_and_others_are_served() {
    let (h, cert) = encrypted_proxy(|_| {}).await;
    let doh = h.doh.unwrap();
    let mut attacker = tls(doh, &cert, &[b"h2"]).await;
    let mut burst = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    burst.extend(frame(4, 0, 0, &[])); // SETTINGS
    // :method POST, :scheme https, :path / (HPACK static table), no END_STREAM.
    let headers = [0x83, 0x87, 0x84];
    for i in 0..2_000u32 {
        let stream = 2 * i + 1;
        burst.extend(frame(1, 0x4, stream, &headers));
        burst.extend(frame(3, 0, stream, &8u32.to_be_bytes())); // RST_STREAM CANCEL
    }
    // The server may close while the burst is still being written.
    let _ = attacker.write_all(&burst).await;
    let _ = attacker.flush().await;
    let mut received = Vec::new();
    let closed = within(Duration::from_secs(20), async {
        let mut buf = [0u8; 16384];
        loop {
            match attacker.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_some(), "the attacker's connection is closed");
    assert!(
        goaway_code(&received) == Some(0xb),
        "GOAWAY ENHANCE_YOUR_CALM sent"
    );
    assert!(
        eventually(|| h
            .stats()
            .encrypted_errors(Transport::Doh, EncryptedError::Http)
            == 1)
        .await,
        "{:?}",
        h.stats().encrypted_errors
    );
    let q = query("www.example.", RecordType::A, None);
    let (status, _, _, body) = doh_request(
        doh,
        &cert,
        true,
        post("/dns-query", "application/dns-message", q),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        ips(&Message::from_vec(&body).unwrap()),
        [Ipv4Addr::new(192, 0, 2, 80)].into()
    );
    h.stop().await;
}

/// The error code of the first GOAWAY frame among the server's frames.
fn goaway_code(mut bytes: &[u8]) -> Option<u32> {
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let kind = bytes[3];
        let payload = bytes.get(9..9 + len)?;
        if kind == 7 && payload.len() >= 8 {
            return Some(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
        }
        bytes = &bytes[9 + len..];
    }
    None
}

#[tokio::test]
async fn a_replaced_certificate_is_presented_to_the_next_connections() {
    let (h, first, certificates) = encrypted_proxy_with(|_| {}).await;
    let second = test_cert();
    certificates.replace(second.key.clone());
    let mut stream = tls(h.dot.unwrap(), &second, &[b"dot"]).await;
    let q = query("www.example.", RecordType::A, None);
    dot_send(&mut stream, &[&q]).await;
    assert!(dot_recv(&mut stream).await.is_some());
    // A client that trusts only the first certificate no longer gets through.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(first.der.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(h.dot.unwrap()).await.unwrap();
    let refused = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("dns.test").unwrap(), tcp)
        .await;
    assert!(refused.is_err());
    h.stop().await;
}

/// dnsperf -m doh keeps up to 100 streams open on a connection: every one is answered.
#[tokio::test]
async fn doh_answers_many_concurrent_streams_on_one_connection() {
    let (h, cert) = encrypted_proxy(|_| {}).await;
    let io = TokioIo::new(tls(h.doh.unwrap(), &cert, &[b"h2"]).await);
    let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..1000u32 {
        let mut sender = sender.clone();
        let name = if i % 2 == 0 {
            "www.example."
        } else {
            "denied.example."
        };
        let q = query(name, RecordType::A, None);
        requests.spawn(async move {
            sender.ready().await.unwrap();
            let response = sender
                .send_request(post("/dns-query", "application/dns-message", q))
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, body.len())
        });
    }
    let mut answered = 0;
    while let Some(done) = patiently(requests.join_next()).await {
        let (status, len) = done.unwrap();
        assert_eq!(status, 200);
        assert!(len > 12);
        answered += 1;
    }
    assert_eq!(answered, 1000);
    h.stop().await;
}

/// Headers over 16 KiB: refused (HTTP/1.1: 431 and the connection closed, counted; HTTP/2: the
/// stream refused), and the next client is served.
#[tokio::test]
async fn oversized_headers_are_refused_and_others_are_served() {
    let (h, cert) = encrypted_proxy(|_| {}).await;
    let doh = h.doh.unwrap();
    let q = query("www.example.", RecordType::A, None);
    for h2 in [false, true] {
        let mut request = post("/dns-query", "application/dns-message", q.clone());
        request.headers_mut().insert(
            "x-padding",
            hyper::header::HeaderValue::from_str(&"a".repeat(40_000)).unwrap(),
        );
        let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        let io = TokioIo::new(tls(doh, &cert, &[alpn]).await);
        let status = if h2 {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            patiently(sender.send_request(request))
                .await
                .map(|r| r.status().as_u16())
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            patiently(sender.send_request(request))
                .await
                .map(|r| r.status().as_u16())
        };
        assert!(
            status.as_ref().is_err() || status.as_ref().is_ok_and(|s| *s == 431),
            "h2 {h2}: {status:?}"
        );
        let (status, ..) = doh_request(
            doh,
            &cert,
            h2,
            post("/dns-query", "application/dns-message", q.clone()),
        )
        .await;
        assert_eq!(status, 200);
    }
    h.stop().await;
}
