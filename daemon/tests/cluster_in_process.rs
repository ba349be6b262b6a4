//! The cluster glue in-process: a DNS-only gateway in cluster mode over the in-memory store
//! (the same node side, shared-policy handling and engine as over etcd). A shared policy that
//! does not load is refused alone and the others apply; deleting a policy takes effect while
//! the broken one is still there.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use common::{demo_gateway, office_dns, rcode, until};
use fqdnd_cluster::{Layout, MemoryStore, Op, Store, Txn};
use hickory_proto::op::ResponseCode;

/// The demo's gateway and client group, no local policy, in cluster mode.
fn config() -> String {
    format!(
        "{}---
apiVersion: fqdnd.io/v1
kind: Cluster
spec:
  endpoints: [\"http://127.0.0.1:2379\"]
  prefix: /test
  nodeName: gw1
",
        demo_gateway()
    )
}

/// A shared policy letting the office resolve `allowed`.
fn policy(name: &str, allowed: &str) -> Vec<u8> {
    office_dns(name, &format!("matchName: \"{allowed}\"")).into_bytes()
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

/// Until `name` gets `want` from `server`.
async fn answers(server: std::net::SocketAddr, name: &str, want: ResponseCode) {
    until(&format!("{name}: {want}"), || async move {
        rcode(server, name).await == want
    })
    .await;
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
    let (gateway, _) = common::gateway(dir.path(), "gateway", &config(), Some(store.clone())).await;
    let server = gateway.udp()[0];

    // Both valid shared policies apply; the broken one is refused alone.
    answers(server, "api.example.net.", ResponseCode::NoError).await;
    answers(server, "www.example.test.", ResponseCode::NoError).await;
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
    answers(server, "api.example.net.", ResponseCode::Refused).await;
    assert_eq!(
        rcode(server, "www.example.test.").await,
        ResponseCode::NoError
    );

    gateway.shutdown().await.unwrap();
}
