//! A DNS over TLS upstream: a scripted in-process server (tokio-rustls, a certificate from a
//! test CA made with rcgen) that answers out of order, sends a wrong answer before the right
//! one, sets TC=1, and closes a connection with a query unanswered. The proxy must validate
//! and match every answer by ID as over UDP, pass TC=1 on (nothing to retry over a stream),
//! send an unanswered query again on a new connection, and never use a server whose
//! certificate it cannot verify. (Real servers, Unbound and dnsdist: tests/encrypted_upstreams.rs
//! of the workspace.)

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fqdnd_dnsproxy::{DropReason, QueryResult, UpstreamAddr, UpstreamProtocol};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType, rdata::A};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::harness::{Harness, Mode, eventually, ips, parse_reply, query, udp_exchange};

/// The server's certificate names `dns.test`, signed by `ca` (a PEM file).
struct Pki {
    ca: PathBuf,
    cert: CertificateDer<'static>,
    key: Vec<u8>,
    _dir: tempfile::TempDir,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, issuer.pem()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["dns.test".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    Pki {
        ca,
        cert: cert.der().clone(),
        key: key.serialize_der(),
        _dir: dir,
    }
}

/// What the scripted server received: (connection number, name), in order.
type Received = Arc<Mutex<Vec<(usize, String)>>>;

/// A DoT server on loopback. Per name:
/// - `slow.example.`: answered only after the next query of the connection (out of order);
/// - `mismatch.example.`: an answer to another question first, with the same ID, then the
///   right one;
/// - `tc.example.`: the answer with TC=1;
/// - `drop.example.`: on the first connection, read and then the connection closed
///   unanswered;
/// - any other: `A 192.0.2.1`.
async fn dot_server(pki: &Pki) -> (SocketAddr, Received) {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![pki.cert.clone()],
        PrivateKeyDer::Pkcs8(pki.key.clone().into()),
    )
    .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    let seen = received.clone();
    tokio::spawn(async move {
        for conn in 0.. {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut held: Option<Message> = None;
                loop {
                    let mut len = [0u8; 2];
                    if tls.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let mut raw = vec![0u8; usize::from(u16::from_be_bytes(len))];
                    if tls.read_exact(&mut raw).await.is_err() {
                        return;
                    }
                    let q = Message::from_vec(&raw).unwrap();
                    let name = q.queries[0].name().to_ascii().to_ascii_lowercase();
                    seen.lock().unwrap().push((conn, name.clone()));
                    let mut out = Vec::new();
                    match name.as_str() {
                        "slow.example." => {
                            held = Some(q);
                            continue;
                        }
                        "mismatch.example." => {
                            let mut wrong = q.clone();
                            wrong.queries[0].set_name(Name::from_ascii("other.example.").unwrap());
                            frame(&mut out, &reply(&wrong, false));
                            frame(&mut out, &reply(&q, false));
                        }
                        "tc.example." => frame(&mut out, &reply(&q, true)),
                        "drop.example." if conn == 0 => return,
                        _ => frame(&mut out, &reply(&q, false)),
                    }
                    if let Some(slow) = held.take() {
                        frame(&mut out, &reply(&slow, false));
                    }
                    if tls.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, received)
}

/// The answer to `q`: `A 192.0.2.1`, TC as asked.
fn reply(q: &Message, truncated: bool) -> Vec<u8> {
    let mut r = q.clone();
    r.metadata.message_type = MessageType::Response;
    r.metadata.truncation = truncated;
    r.metadata.recursion_available = true;
    r.answers.push(Record::from_rdata(
        q.queries[0].name().clone(),
        60,
        RData::A(A(Ipv4Addr::new(192, 0, 2, 1))),
    ));
    r.to_vec().unwrap()
}

fn frame(out: &mut Vec<u8>, msg: &[u8]) {
    out.extend_from_slice(&u16::try_from(msg.len()).unwrap().to_be_bytes());
    out.extend_from_slice(msg);
}

fn dot(addr: SocketAddr) -> UpstreamAddr {
    UpstreamAddr {
        addr,
        protocol: UpstreamProtocol::Tls {
            server_name: Some("dns.test".to_owned()),
        },
    }
}

async fn proxy(pki: &Pki, upstream: SocketAddr) -> Harness {
    let ca = pki.ca.clone();
    Harness::start(Mode::Done, |c| {
        c.upstreams = vec![dot(upstream)];
        c.upstream_ca = Some(ca);
    })
    .await
}

async fn ask(h: &Harness, name: &str) -> Message {
    let q = query(name, RecordType::A, Some((1232, false)));
    let r = udp_exchange(h.udp, &q).await;
    parse_reply(&q, &r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_matched_by_id_in_any_order_validated_and_observed() {
    let pki = pki();
    let (server, received) = dot_server(&pki).await;
    let h = proxy(&pki, server).await;
    let www = [Ipv4Addr::new(192, 0, 2, 1)].into();

    // `slow` is answered after `www`, on the same connection: both get their own answer.
    let udp = h.udp;
    let slow = tokio::spawn(async move {
        let q = query("slow.example.", RecordType::A, None);
        let r = udp_exchange(udp, &q).await;
        parse_reply(&q, &r)
    });
    assert!(eventually(|| received.lock().unwrap().len() == 1).await);
    let first = ask(&h, "www.example.").await;
    assert_eq!(ips(&first), www);
    let slow = slow.await.unwrap();
    assert_eq!(slow.queries[0].name().to_ascii(), "slow.example.");
    assert_eq!(ips(&slow), www);

    // An answer to another question is dropped and counted; the right one follows.
    let m = ask(&h, "mismatch.example.").await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(ips(&m), www);

    // TC=1 over TLS is the server's answer: passed on, observed, not retried.
    let tc = ask(&h, "tc.example.").await;
    assert!(tc.metadata.truncation);
    assert_eq!(ips(&tc), www);
    let observed = h.observer.seen_name("tc.example.");
    assert_eq!(observed.len(), 1);
    assert!(observed[0].truncated);
    assert_eq!(observed[0].upstream, server);

    let stats = h.settled().await;
    assert_eq!(stats.dropped(DropReason::QuestionMismatch), 1);
    assert_eq!(stats.queries(QueryResult::Answered), 4);
    assert_eq!(stats.upstreams[0].label, format!("tls://{server}#dns.test"));
    assert!(stats.upstreams[0].alive && stats.upstreams[0].last_rtt.is_some());
    // One connection carried every query (the health probe, if one ran, too).
    let got = received.lock().unwrap().clone();
    assert!(got.iter().all(|(conn, _)| *conn == 0), "{got:?}");
    for name in [
        "slow.example.",
        "www.example.",
        "mismatch.example.",
        "tc.example.",
    ] {
        assert_eq!(
            got.iter().filter(|(_, n)| n == name).count(),
            1,
            "{name} once: {got:?}"
        );
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_the_server_closed_on_is_sent_again_on_a_new_connection() {
    let pki = pki();
    let (server, received) = dot_server(&pki).await;
    let h = proxy(&pki, server).await;
    let m = ask(&h, "drop.example.").await;
    assert_eq!(ips(&m), [Ipv4Addr::new(192, 0, 2, 1)].into());
    let got = received.lock().unwrap().clone();
    let drops: Vec<usize> = got
        .iter()
        .filter(|(_, n)| n == "drop.example.")
        .map(|(c, _)| *c)
        .collect();
    assert_eq!(
        drops,
        [0, 1],
        "asked on the first connection, then on the second"
    );
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::UpstreamTimeout), 0);
    assert_eq!(stats.queries(QueryResult::Answered), 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_another_authority_is_never_asked_and_goes_dead() {
    let pki = pki();
    let other = self::pki();
    let (server, received) = dot_server(&pki).await;
    // The proxy trusts another CA than the one that signed the server's certificate.
    let ca = other.ca.clone();
    let h = Harness::start(Mode::Done, |c| {
        c.upstreams = vec![dot(server)];
        c.upstream_ca = Some(ca);
        c.upstream_timeout = Duration::from_millis(300);
        c.health_check_failures = 1;
    })
    .await;
    let m = ask(&h, "www.example.").await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(eventually(|| !h.stats().upstreams[0].alive).await);
    let m = ask(&h, "www.example.").await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(
        received.lock().unwrap().is_empty(),
        "no query left unverified"
    );
    let stats = h.settled().await;
    assert_eq!(stats.queries(QueryResult::UpstreamTimeout), 1);
    assert_eq!(stats.queries(QueryResult::NoUpstream), 1);
    h.stop().await;
}
