//! The gateway in-process (no child process, no kernel: the DNS-only gateway over the memory
//! datapath): reload applies a changed policy, a configuration that does not load is refused
//! whole and the policy in force stays, and shutdown joins every task.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use fqdnd_daemon::skeleton::StartOptions;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use tokio::net::UdpSocket;

/// The demo's configuration (a static zone as the upstream, client group `office` on
/// 127.0.0.0/8) with `allowed` as the one name its DNS rule lets through.
fn config(allowed: &str) -> String {
    let demo = include_str!("../../examples/gateway-demo.yaml");
    let (zones, _) = demo
        .split_once("---\napiVersion: cilium.io/v2")
        .expect("the demo's policy follows its gateway and client group");
    format!(
        "{zones}---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata:
  name: office-egress
spec:
  endpointSelector:
    matchLabels:
      site: office
  egress:
  - toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns:
        - matchName: \"{allowed}\"
"
    )
}

async fn rcode(server: SocketAddr, name: &str) -> ResponseCode {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut query = Message::new(0x1234, MessageType::Query, OpCode::Query);
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
    Message::from_vec(&buf[..n]).unwrap().metadata.response_code
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_change_and_refuses_a_broken_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.yaml");
    write(&file, &config("api.example.net"));
    let gateway = fqdnd_daemon::gateway::start(StartOptions {
        paths: vec![file.clone()],
        demo: false,
        admin_socket: Some(dir.path().join("admin.sock")),
        strict_restore: false,
        cluster_store: None,
    })
    .await
    .unwrap();
    let server = gateway.udp()[0];
    assert_eq!(
        rcode(server, "api.example.net.").await,
        ResponseCode::NoError
    );
    assert_eq!(
        rcode(server, "other.example.net.").await,
        ResponseCode::Refused
    );

    // A changed policy: in force as soon as reload returns.
    write(&file, &config("other.example.net"));
    let reload = gateway.reload();
    assert!(reload.ok, "{:?}", reload.errors);
    assert_eq!(
        rcode(server, "other.example.net.").await,
        ResponseCode::NoError
    );
    assert_eq!(
        rcode(server, "api.example.net.").await,
        ResponseCode::Refused
    );

    // A file that does not load: refused whole, with its location; the policy in force stays.
    write(
        &file,
        &config("other.example.net").replace("matchName", "matchNmae"),
    );
    let reload = gateway.reload();
    assert!(!reload.ok);
    assert!(
        reload.errors.iter().any(|e| e.contains("gateway.yaml:")),
        "{:?}",
        reload.errors
    );
    assert_eq!(
        rcode(server, "other.example.net.").await,
        ResponseCode::NoError
    );
    assert_eq!(
        rcode(server, "api.example.net.").await,
        ResponseCode::Refused
    );

    gateway.shutdown().await.unwrap();
    assert!(
        std::net::UdpSocket::bind(server).is_ok(),
        "the listener is closed once shutdown returns"
    );
}
