//! The HA glue in-process: two gateways of one group over the in-memory store, each with its
//! admin API. What one learns, the other imports (and lists); a name its own policy refuses it
//! does not import; `cache forget` on one unlearns the name on both.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::path::{Path, PathBuf};

use common::{demo_gateway, office_dns, rcode, until};
use fqdnd_cluster::MemoryStore;
use fqdnd_daemon::admin::{ForgetOutcome, ForgetRequest, client};
use fqdnd_daemon::skeleton::Running;
use fqdnd_engine::view::CacheRow;
use hickory_proto::op::ResponseCode;

/// The demo gateway whose policy lets the office resolve `pattern`, in HA group `pair` as
/// `name`.
fn config(name: &str, pattern: &str) -> String {
    format!(
        "{}---
{}---
apiVersion: fqdnd.io/v1
kind: Cluster
spec:
  endpoints: [\"http://127.0.0.1:2379\"]
  prefix: /ha
  nodeName: {name}
  gatewayGroup: pair
",
        demo_gateway(),
        office_dns("office-dns", &format!("matchPattern: \"{pattern}\""))
    )
}

async fn start(dir: &Path, name: &str, pattern: &str, store: &MemoryStore) -> (Running, PathBuf) {
    let (mut running, _) =
        common::gateway(dir, name, &config(name, pattern), Some(store.clone())).await;
    let socket = dir.join(format!("{name}.sock"));
    fqdnd_daemon::admin::server::spawn(&mut running).unwrap();
    (running, socket)
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

/// Until the names `socket`'s gateway holds pass `check`.
async fn holds(what: &str, socket: &Path, check: impl Fn(&[String]) -> bool) {
    until(what, || async { check(&names(socket).await) }).await;
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
    holds("gw2 imports www", &admin2, |n| {
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
    holds("gw1 forgets www", &admin1, |n| {
        !n.iter().any(|n| n == "www.example.test.")
    })
    .await;
    holds("gw2 forgets www", &admin2, |n| {
        !n.iter().any(|n| n == "www.example.test.")
    })
    .await;

    gw1.shutdown().await.unwrap();
    gw2.shutdown().await.unwrap();
}
