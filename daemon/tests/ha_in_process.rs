//! The HA glue in-process: two gateways of one group over the in-memory store, each with its
//! admin API. What one learns, the other imports (and lists); a name its own policy refuses it
//! does not import; `cache forget` on one unlearns the name on both.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fqdnd_cluster::MemoryStore;
use fqdnd_daemon::admin::{ForgetOutcome, ForgetRequest, client};
use fqdnd_daemon::skeleton::{Running, StartOptions};
use fqdnd_engine::view::CacheRow;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use tokio::net::UdpSocket;

/// The demo gateway (static zones, client group `office` on 127.0.0.0/8) whose policy lets
/// the office resolve `pattern`, in HA group `pair` as `name`.
fn config(name: &str, pattern: &str) -> String {
    let demo = include_str!("../../examples/gateway-demo.yaml");
    let (gateway, _) = demo
        .split_once("---\napiVersion: cilium.io/v2")
        .expect("the demo's policy follows its gateway and client group");
    format!(
        "{gateway}---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata:
  name: office-dns
spec:
  endpointSelector:
    matchLabels:
      site: office
  egress:
  - toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns:
        - matchPattern: \"{pattern}\"
---
apiVersion: fqdnd.io/v1
kind: Cluster
spec:
  endpoints: [\"http://127.0.0.1:2379\"]
  prefix: /ha
  nodeName: {name}
  gatewayGroup: pair
"
    )
}

async fn start(dir: &Path, name: &str, pattern: &str, store: &MemoryStore) -> (Running, PathBuf) {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, config(name, pattern)).unwrap();
    let socket = dir.join(format!("{name}.sock"));
    let mut running = fqdnd_daemon::gateway::start(StartOptions {
        paths: vec![file],
        demo: false,
        admin_socket: Some(socket.clone()),
        strict_restore: false,
        cluster_store: Some(store.clone()),
    })
    .await
    .unwrap();
    fqdnd_daemon::admin::server::spawn(&mut running).unwrap();
    (running, socket)
}

async fn rcode(server: SocketAddr, name: &str) -> ResponseCode {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut query = Message::new(0x7070, MessageType::Query, OpCode::Query);
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

/// The names in a gateway's DNS cache, through its admin API (the client blocks: off the
/// runtime).
async fn names(socket: &Path) -> Vec<String> {
    let socket = socket.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let (_, rows): (_, Vec<CacheRow>) = client::get(&socket, "/v1/cache").unwrap();
        rows.into_iter().map(|r| r.fqdn).collect()
    })
    .await
    .unwrap()
}

async fn until(what: &str, socket: &Path, check: impl Fn(&[String]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = names(socket).await;
        if check(&now) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 30 s ({now:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_imports_what_its_policy_allows_and_forgets_with_the_group() {
    let store = MemoryStore::new();
    let dir = tempfile::tempdir().unwrap();
    let (gw1, admin1) = start(dir.path(), "gw1", "*.example.test", &store).await;
    // gw2 allows only www: it must not import shop's chain.
    let (gw2, admin2) = start(dir.path(), "gw2", "www.example.test", &store).await;
    let server = gw1.udp()[0];

    assert_eq!(
        rcode(server, "www.example.test.").await,
        ResponseCode::NoError
    );
    assert_eq!(
        rcode(server, "shop.example.test.").await,
        ResponseCode::NoError
    );
    until("gw2 imports www", &admin2, |n| {
        n.iter().any(|n| n == "www.example.test.")
    })
    .await;
    let on_gw2 = names(&admin2).await;
    assert!(
        !on_gw2.iter().any(|n| n.starts_with("shop.")),
        "gw2's policy refuses shop: {on_gw2:?}"
    );

    // Forgotten on gw1: out of the group's keys, so gw2 unlearns it too.
    let forget = ForgetRequest {
        name: "www.example.test".into(),
        addresses: Vec::new(),
        client: None,
    };
    let admin = admin1.clone();
    let (_, outcome): (_, ForgetOutcome) = tokio::task::spawn_blocking(move || {
        client::post_json(&admin, "/v1/cache/forget", &forget).unwrap()
    })
    .await
    .unwrap();
    assert!(outcome.mappings > 0, "{outcome:?}");
    until("gw1 forgets www", &admin1, |n| {
        !n.iter().any(|n| n == "www.example.test.")
    })
    .await;
    until("gw2 forgets www", &admin2, |n| {
        !n.iter().any(|n| n == "www.example.test.")
    })
    .await;

    gw1.shutdown().await.unwrap();
    gw2.shutdown().await.unwrap();
}
