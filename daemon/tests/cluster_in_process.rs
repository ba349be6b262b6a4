//! The cluster glue in-process: a DNS-only gateway in cluster mode over the in-memory store
//! (the same node side, shared-policy handling and engine as over etcd). A shared policy that
//! does not load is refused alone and the others apply; deleting a policy takes effect while
//! the broken one is still there.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::net::SocketAddr;
use std::time::Duration;

use fqdnd_cluster::{Layout, MemoryStore, Op, Store, Txn};
use fqdnd_daemon::skeleton::StartOptions;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use tokio::net::UdpSocket;

/// The demo's gateway and client group (static zones as the upstream), no local policy, and
/// cluster mode.
fn config() -> String {
    let demo = include_str!("../../examples/gateway-demo.yaml");
    let (gateway, _) = demo
        .split_once("---\napiVersion: cilium.io/v2")
        .expect("the demo's policy follows its gateway and client group");
    format!(
        "{gateway}---
apiVersion: fqdnd.io/v1
kind: Cluster
spec:
  endpoints: [\"http://127.0.0.1:2379\"]
  prefix: /test
  nodeName: gw1
"
    )
}

/// A shared policy letting the office resolve `name`.
fn policy(name: &str, allowed: &str) -> Vec<u8> {
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
        - matchName: \"{allowed}\"
"
    )
    .into_bytes()
}

async fn txn(store: &MemoryStore, op: Op) {
    let outcome = store
        .txn(Txn {
            compares: Vec::new(),
            ops: vec![op],
        })
        .await
        .unwrap();
    assert!(outcome.succeeded);
}

async fn rcode(server: SocketAddr, name: &str) -> ResponseCode {
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
    Message::from_vec(&buf[..n]).unwrap().metadata.response_code
}

/// Polls until `name` gets `want` (the node side applies etcd's changes asynchronously).
async fn until(server: SocketAddr, name: &str, want: ResponseCode) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = rcode(server, name).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: {got} after 30 s, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_shared_policy_is_refused_alone_and_a_deletion_still_applies() {
    let store = MemoryStore::new();
    let layout = Layout::new("/test");
    txn(
        &store,
        Op::Put {
            key: layout.policy("api"),
            value: policy("api", "api.example.net"),
            lease: None,
        },
    )
    .await;
    txn(
        &store,
        Op::Put {
            key: layout.policy("www"),
            value: policy("www", "www.example.test"),
            lease: None,
        },
    )
    .await;
    txn(
        &store,
        Op::Put {
            key: layout.policy("broken"),
            value: b"this: [is not".to_vec(),
            lease: None,
        },
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.yaml");
    std::fs::write(&file, config()).unwrap();
    let gateway = fqdnd_daemon::gateway::start(StartOptions {
        paths: vec![file],
        demo: false,
        admin_socket: Some(dir.path().join("admin.sock")),
        strict_restore: false,
        cluster_store: Some(store.clone()),
    })
    .await
    .unwrap();
    let server = gateway.udp()[0];

    // Both valid shared policies apply; the broken one is refused alone.
    until(server, "api.example.net.", ResponseCode::NoError).await;
    until(server, "www.example.test.", ResponseCode::NoError).await;
    assert_eq!(
        rcode(server, "other.example.net.").await,
        ResponseCode::Refused
    );

    // Deleting one while the broken one is still in etcd: enforced.
    txn(
        &store,
        Op::Delete {
            key: layout.policy("api"),
        },
    )
    .await;
    until(server, "api.example.net.", ResponseCode::Refused).await;
    assert_eq!(
        rcode(server, "www.example.test.").await,
        ResponseCode::NoError
    );

    gateway.shutdown().await.unwrap();
}
