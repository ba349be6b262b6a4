//! The daemon's in-process tests' shared harness: the demo gateway's configuration with a
//! policy of the test's own, a DNS client, and polling with a deadline.

#![allow(
    dead_code,
    unreachable_pub,
    reason = "each test crate uses part of the harness"
)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use fqdnd_daemon::skeleton::{Running, StartOptions};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;

/// The demo's gateway and client group `office` (127.0.0.0/8, label `site: office`), static
/// zones as the upstream, without the demo's policy.
pub fn demo_gateway() -> &'static str {
    let demo = include_str!("../../../examples/gateway-demo.yaml");
    demo.split_once("---\napiVersion: cilium.io/v2")
        .expect("the demo's policy follows its gateway and client group")
        .0
}

/// A gateway started in-process from `config`, written to `dir/<name>.yaml` (returned, for a
/// test that changes it), its admin socket `dir/<name>.sock`; cluster mode over `store`.
pub async fn gateway(
    dir: &Path,
    name: &str,
    config: &str,
    store: Option<fqdnd_cluster::MemoryStore>,
) -> (Running, PathBuf) {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, config).unwrap();
    let running = fqdnd_daemon::gateway::start(StartOptions {
        paths: vec![file.clone()],
        demo: false,
        admin_socket: Some(dir.join(format!("{name}.sock"))),
        strict_restore: false,
        cluster_store: store,
    })
    .await
    .unwrap();
    (running, file)
}

/// A clusterwide policy `name` letting the office resolve what `dns` (one `matchName:` or
/// `matchPattern:` entry) allows.
pub fn office_dns(name: &str, dns: &str) -> String {
    format!(
        "apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata:
  name: {name}
spec:
  endpointSelector:
    matchLabels:
      site: office
  egress:
  - toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns:
        - {dns}
"
    )
}

/// The answer `server` gives an A query for `name` from 127.0.0.1.
pub async fn ask(server: SocketAddr, name: &str) -> Message {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut query = Message::new(0x4242, MessageType::Query, OpCode::Query);
    query.metadata.recursion_desired = true;
    query
        .queries
        .push(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    socket
        .send_to(&query.to_vec().unwrap(), server)
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(10), socket.recv_from(&mut buf))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

/// The response code `server` gives an A query for `name` from 127.0.0.1.
pub async fn rcode(server: SocketAddr, name: &str) -> ResponseCode {
    ask(server, name).await.metadata.response_code
}

/// The IPv4 addresses of `answer`.
pub fn addresses(answer: &Message) -> Vec<Ipv4Addr> {
    answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

/// A resolver on loopback that answers every A question with `address` (TTL 60): what a
/// real upstream does for the test's names. It runs until the test's runtime stops.
pub async fn upstream_answering(address: Ipv4Addr) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut reply = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
            reply.metadata.recursion_desired = query.metadata.recursion_desired;
            reply.metadata.recursion_available = true;
            for q in &query.queries {
                reply.queries.push(q.clone());
                if q.query_type() == RecordType::A {
                    reply.answers.push(Record::from_rdata(
                        q.name().clone(),
                        60,
                        RData::A(A(address)),
                    ));
                }
            }
            if let Ok(bytes) = reply.to_vec() {
                let _ = socket.send_to(&bytes, from).await;
            }
        }
    });
    addr
}

/// Polls `check` until it holds; fails after 30 s with `what` (the daemon applies changes
/// from its store and its peers asynchronously).
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
